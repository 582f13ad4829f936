package wire

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSubjectsLiveUnderTheClusterPrefix(t *testing.T) {
	s := NewSubjects("c1")
	require.Equal(t, "sy.c1.kv.w1", s.KV("w1"))
	require.Equal(t, "sy.c1.kv.*", s.KVAll())
	require.Equal(t, "sy.c1.load.w1", s.Load("w1"))
	require.Equal(t, "sy.c1.load.*", s.LoadAll())
	require.Equal(t, "sy.c1.kvdump.w1", s.KVDump("w1"))
	require.Equal(t, "sy.c1.admit.gold", s.Admit("gold"))
	require.Equal(t, "sy.c1.cancel.gold", s.Cancel("gold"))
	require.Equal(t, "sy.c1.life.r1", s.Life("r1"))
	require.Equal(t, "sy.c1.adopt.gold", s.Adopt("gold"))
	require.Equal(t, "w1", WorkerFromSubject(s.KV("w1")))
	require.Equal(t, "plain", WorkerFromSubject("plain"), "a subject without dots is its own last token")
}

func TestKeysLiveUnderTheClusterPrefix(t *testing.T) {
	k := NewKeys("c1")
	require.Equal(t, "/switchyard/c1/", k.Prefix())
	require.Equal(t, "/switchyard/c1/replicas/r1", k.Replica("r1"))
	require.Equal(t, "/switchyard/c1/workers/w1", k.Worker("w1"))
	require.Equal(t, "/switchyard/c1/classes/gold/owner", k.ClassOwner("gold"))
	require.Equal(t, "/switchyard/c1/config/policy", k.PolicyConfig())
}

func TestClassFromOwnerKeyInvertsClassOwner(t *testing.T) {
	k := NewKeys("c1")
	name, err := k.ClassFromOwnerKey(k.ClassOwner("gold"))
	require.NoError(t, err)
	require.Equal(t, "gold", name)
	for _, bad := range []string{
		"/switchyard/c2/classes/gold/owner", // another cluster
		"/switchyard/c1/classes/gold",       // no owner suffix
		"/switchyard/c1/classes//owner",     // empty class
		"/switchyard/c1/classes/a/b/owner",  // nested
	} {
		_, err := k.ClassFromOwnerKey(bad)
		require.ErrorIs(t, err, ErrMalformed, bad)
	}
}

func TestValidNameAcceptsOnlySubjectAndKeySafeTokens(t *testing.T) {
	for _, ok := range []string{"a", "worker-1", "W_2", strings.Repeat("x", 128)} {
		require.True(t, ValidName(ok), ok)
	}
	for _, bad := range []string{"", "a.b", "a*", "a>", "a b", "a/b", "é", strings.Repeat("x", 129)} {
		require.False(t, ValidName(bad), bad)
	}
}

func FuzzClassFromOwnerKey(f *testing.F) {
	k := NewKeys("c")
	f.Add(k.ClassOwner("gold"))
	f.Add("/switchyard/c/classes//owner")
	f.Fuzz(func(t *testing.T, key string) {
		name, err := k.ClassFromOwnerKey(key)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if k.ClassOwner(name) != key {
			t.Fatalf("ClassOwner(%q) = %q, want %q", name, k.ClassOwner(name), key)
		}
	})
}
