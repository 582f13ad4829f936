package gossip

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

var (
	keyA = []byte("0123456789abcdef")
	keyB = []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZ012345")
)

// converged waits until every replica sees all of them and every one's
// newest load (value v on worker "w-<name>") reached every other.
func converged(t *testing.T, rs []*replica, v int) {
	t.Helper()
	for _, r := range rs {
		r.SetLocalLoads(map[string]WorkerLoad{"w-" + r.cfg.NodeName: {ActiveRequests: v}})
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, r := range rs {
			if len(r.Members()) != len(rs) {
				return false
			}
			for _, o := range rs {
				if o != r && r.RemoteLoad("w-"+o.cfg.NodeName).ActiveRequests != v {
					return false
				}
			}
		}
		return true
	}, "all replicas see each other and load %d", v)
}

func TestARotatedKeyKeepsAThreeNodeClusterWhole(t *testing.T) {
	rs := startCluster(t, 3, func(c *Config) { c.SecretKey = keyA })
	converged(t, rs, 1)
	// The procedure of docs/security.md, one member at a time at each step,
	// with the cluster checked between members: every mix of old and new
	// keyrings occurs on the way.
	steps := []Keys{
		{Primary: keyA, Others: [][]byte{keyB}}, // install the new key
		{Primary: keyB, Others: [][]byte{keyA}}, // switch the primary
		{Primary: keyB},                         // remove the old key
	}
	v := 1
	for _, k := range steps {
		for _, r := range rs {
			require.NoError(t, r.SetKeys(k))
			require.Equal(t, k, r.CurrentKeys())
			v++
			converged(t, rs, v)
		}
	}
	for _, r := range rs {
		for _, bad := range []string{"no installed keys could decrypt", "Suspect", "as failed", "not encrypted"} {
			require.Zero(t, r.logs.FilterMessageSnippet(bad).Len(), "%s logged %q during the rotation", r.cfg.NodeName, bad)
		}
	}
	// The old key no longer gets anyone in.
	old := testConfig("old-key")
	old.SecretKey = keyA
	old.Join = []string{rs[0].Addr()}
	o := startReplica(t, old)
	testenv.Eventually(t, 20*time.Second, func() bool { return counter(t, o.m.joinFailures) >= 2 }, "a node with the removed key fails to join")
	require.Len(t, rs[0].Members(), 3)
	// The new key does.
	nu := testConfig("new-key")
	nu.SecretKey = keyB
	nu.Join = []string{rs[0].Addr()}
	startReplica(t, nu)
	testenv.Eventually(t, 20*time.Second, func() bool { return len(rs[0].Members()) == 4 }, "a node with the new key joins")
}

func TestAMemberLeftWithoutTheClustersKeyIsDropped(t *testing.T) {
	rs := startCluster(t, 3, func(c *Config) {
		c.SecretKey = keyA
		c.ProbeInterval, c.ProbeTimeout, c.SuspicionMult = 200*time.Millisecond, 100*time.Millisecond, 2
	})
	converged(t, rs, 1)
	// r0 and r1 rotate to B; r2 misses the rotation and keeps only A.
	for _, k := range []Keys{{Primary: keyA, Others: [][]byte{keyB}}, {Primary: keyB, Others: [][]byte{keyA}}, {Primary: keyB}} {
		require.NoError(t, rs[0].SetKeys(k))
		require.NoError(t, rs[1].SetKeys(k))
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return len(rs[0].Members()) == 2 && len(rs[1].Members()) == 2
	}, "r0 and r1 drop r2, which cannot decrypt their probes nor they its answers")
	require.ElementsMatch(t, []string{"r0", "r1"}, memberNames(rs[0].Members()))
	rs[2].SetLocalLoads(map[string]WorkerLoad{"w-r2": {ActiveRequests: 99}})
	rs[0].SetLocalLoads(map[string]WorkerLoad{"w-r0": {ActiveRequests: 2}})
	testenv.Eventually(t, 10*time.Second, func() bool { return rs[1].RemoteLoad("w-r0").ActiveRequests == 2 }, "r0 and r1 still gossip")
	require.NotEqual(t, 99, rs[1].RemoteLoad("w-r2").ActiveRequests, "nothing r2 sends gets in")
}

func writeKeyring(t *testing.T, path string, keys ...[]byte) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# primary first\n")
	for _, k := range keys {
		b.WriteString(base64.StdEncoding.EncodeToString(k) + "\n")
	}
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(b.String()), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

func TestTheKeyringFileIsInstalledWhenItChangesAndABrokenOneKeepsTheKeys(t *testing.T) {
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "r0.keys"), filepath.Join(dir, "r1.keys")}
	for _, p := range paths {
		writeKeyring(t, p, keyA)
	}
	i := 0
	rs := startCluster(t, 2, func(c *Config) {
		c.SecretKey = nil
		c.KeyringFile = paths[i]
		c.KeyringCheckInterval = 20 * time.Millisecond
		i++
	})
	for _, step := range [][][]byte{{keyA, keyB}, {keyB, keyA}, {keyB}} {
		for j, p := range paths {
			writeKeyring(t, p, step...)
			want := Keys{Primary: step[0], Others: step[1:]}
			if len(want.Others) == 0 {
				want.Others = nil
			}
			testenv.Eventually(t, 10*time.Second, func() bool {
				got := rs[j].CurrentKeys()
				return string(got.Primary) == string(want.Primary) && len(got.Others) == len(want.Others)
			}, "r%d installs the file's keys", j)
		}
	}
	converged(t, rs, 7)
	applied := counter(t, rs[0].km.reloads.WithLabelValues("applied"))
	require.InDelta(t, 3, applied, 0)

	require.NoError(t, os.WriteFile(paths[0], []byte("not base64 at all\n"), 0o600))
	testenv.Eventually(t, 10*time.Second, func() bool { return counter(t, rs[0].km.reloads.WithLabelValues("failed")) == 1 }, "the broken file is counted")
	require.Equal(t, Keys{Primary: keyB}, rs[0].CurrentKeys(), "and the installed keys stay")
	converged(t, rs, 8)
}

func TestParseKeyringNamesTheBadLine(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString
	k, err := ParseKeyring([]byte("\n# c\n" + b64(keyB) + "\n" + b64(keyA) + "\n" + b64(keyB) + "\n"))
	require.NoError(t, err)
	require.Equal(t, Keys{Primary: keyB, Others: [][]byte{keyA}}, k)
	_, err = ParseKeyring([]byte(b64(keyA) + "\n" + b64([]byte("short")) + "\n"))
	require.ErrorIs(t, err, ErrInvalidKeyring)
	require.ErrorContains(t, err, "line 2")
	_, err = ParseKeyring([]byte("# only a comment\n"))
	require.ErrorContains(t, err, "no key")
	_, err = ParseKeyring([]byte("%%%\n"))
	require.ErrorContains(t, err, "line 1 is not base64")
}

func TestEncryptionCanBeRequiredAndKeysNeedAnEncryptedStart(t *testing.T) {
	c := testConfig("x")
	c.SecretKey = nil
	c.RequireEncryption = true
	require.ErrorContains(t, c.Validate(), "SecretKey")
	c.SecretKey = keyA
	c.KeyringFile = "f"
	require.ErrorContains(t, c.Validate(), "KeyringFile")
	plain := newIdle(t, func(c *Config) { c.SecretKey = nil })
	require.ErrorIs(t, plain.SetKeys(Keys{Primary: keyA}), ErrNoEncryption)
}

func FuzzParseKeyring(f *testing.F) {
	f.Add([]byte(base64.StdEncoding.EncodeToString(keyA) + "\n"))
	f.Add([]byte("# x\n\n" + base64.StdEncoding.EncodeToString(keyB)))
	f.Add([]byte("!!"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseKeyring(b)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidKeyring)
			return
		}
		require.NoError(t, checkKey(k.Primary))
		for _, o := range k.Others {
			require.NoError(t, checkKey(o))
		}
	})
}
