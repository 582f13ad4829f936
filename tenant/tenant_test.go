package tenant

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/switchyard/switchyard/internal/clock"

	"github.com/switchyard/switchyard/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func keysFile(tenants ...string) string {
	return "tenants:\n" + strings.Join(tenants, "")
}

func tenantYAML(id string, keys ...string) string {
	var b strings.Builder
	b.WriteString("  - id: " + id + "\n    keys:\n")
	for _, k := range keys {
		b.WriteString("      - " + HashKey(k) + "\n")
	}
	return b.String()
}

func TestAKeyFindsItsTenantAndAnUnknownKeyFindsNothing(t *testing.T) {
	set, err := Parse([]byte(`
tenants:
  - id: acme
    keys: ["` + HashKey("sk-acme-1") + `", "` + HashKey("sk-acme-2") + `"]
    models: [llama]
    default_class: standard
    classes: [batch]
    weight: 3
    quota: {concurrent: 10, requests_per_minute: 600, tokens_per_minute: 100000}
  - id: beta
    keys: ["` + HashKey("sk-beta") + `"]
`))
	require.NoError(t, err)
	acme, ok := set.Lookup("sk-acme-2")
	require.True(t, ok)
	require.Equal(t, "acme", acme.ID)
	require.Equal(t, 3, acme.Weight)
	require.Equal(t, Quota{Concurrent: 10, RequestsPerMinute: 600, TokensPerMinute: 100000}, acme.Quota)
	require.True(t, acme.AllowsModel("llama"))
	require.False(t, acme.AllowsModel("gpt"))
	require.True(t, acme.AllowsClass("standard"))
	require.True(t, acme.AllowsClass("batch"))
	require.False(t, acme.AllowsClass("realtime"))

	beta, ok := set.Lookup("sk-beta")
	require.True(t, ok)
	require.Equal(t, 1, beta.Weight, "weight defaults to 1")
	require.True(t, beta.AllowsModel("anything"))

	for _, k := range []string{"", "sk-acme", "sk-acme-1 ", "SK-BETA"} {
		_, ok := set.Lookup(k)
		require.False(t, ok, "%q", k)
	}
}

func TestHashKeyIsSHA256InHex(t *testing.T) {
	// sha256("abc"), FIPS 180-2 appendix B.1.
	require.Equal(t, "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", HashKey("abc"))
}

func TestAnInvalidKeysFileNamesEveryProblemButNoKey(t *testing.T) {
	const plain = "sk-this-is-a-plain-key-pasted-by-mistake"
	_, err := Parse([]byte(`
tenants:
  - id: acme
    keys: ["` + plain + `"]
    weight: 5000
    quota: {concurrent: -1}
  - id: acme
    keys: ["` + HashKey("x") + `"]
  - id: "bad id"
    keys: ["` + HashKey("y") + `"]
  - id: nokeys
  - id: ok
    keys: ["` + HashKey("z") + `"]
  - id: dup
    keys: ["` + HashKey("z") + `"]
    classes: ["a.b"]
`))
	require.ErrorIs(t, err, ErrInvalid)
	msg := err.Error()
	for _, want := range []string{"tenant acme: keys[0]", "weight 5000", "quota: negative", `tenants[1].id "acme": duplicate`,
		`tenants[2].id "bad id"`, "tenant nokeys: keys: none", "also listed for tenant", `"a.b" is not a class name`} {
		require.Contains(t, msg, want)
	}
	require.NotContains(t, msg, plain, "a key must never be echoed")
}

func TestUnknownFieldsInTheKeysFileAreRejected(t *testing.T) {
	_, err := Parse([]byte("tenants:\n  - id: a\n    keys: [\"" + HashKey("k") + "\"]\n    quotas: {concurrent: 1}\n"))
	require.ErrorIs(t, err, ErrInvalid)
	require.Contains(t, err.Error(), "quotas")
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
}

func TestTheStoreReloadsAChangedFileAndKeepsTheLastGoodOneWhenInvalid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	writeFile(t, path, keysFile(tenantYAML("acme", "k1")))
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.InfoLevel)
	clk := clock.NewFake(time.Unix(1.7e9, 0))
	cfg := DefaultConfig()
	cfg.KeysFile = path
	s, err := NewStore(cfg, zap.New(core), NewMetrics(reg), clk)
	require.NoError(t, err)
	_, ok := s.Lookup("k1")
	require.True(t, ok)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	writeFile(t, path, keysFile(tenantYAML("acme", "k2"), tenantYAML("beta", "k3")))
	require.Eventually(t, func() bool {
		clk.Advance(cfg.ReloadInterval)
		_, ok := s.Lookup("k3")
		return ok
	}, 5*time.Second, 10*time.Millisecond, "a changed file is reloaded without a restart")
	_, ok = s.Lookup("k1")
	require.False(t, ok, "a removed key stops working")

	writeFile(t, path, "tenants: [{id: broken}]")
	require.Eventually(t, func() bool {
		clk.Advance(cfg.ReloadInterval)
		return testutil.ToFloat64(s.m.reloads.WithLabelValues("error")) >= 1 &&
			logs.FilterMessage("keys file not reloaded; the last good keys stay in use").Len() >= 1
	}, 5*time.Second, 10*time.Millisecond, "an invalid file is counted and logged")
	_, ok = s.Lookup("k2")
	require.True(t, ok, "an invalid file keeps the last good keys")
	require.Equal(t, 2.0, testutil.ToFloat64(s.m.tenants))
	for _, e := range logs.All() {
		for _, f := range e.Context {
			require.NotContains(t, f.String, "k2")
		}
	}
}

func TestAStoreDoesNotStartWithAnInvalidOrMissingFile(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.KeysFile = filepath.Join(dir, "missing.yaml")
	_, err := NewStore(cfg, zap.NewNop(), nil, nil)
	require.ErrorIs(t, err, os.ErrNotExist)
	cfg.KeysFile = filepath.Join(dir, "bad.yaml")
	writeFile(t, cfg.KeysFile, "tenants: [{id: x, keys: [nothash]}]")
	_, err = NewStore(cfg, zap.NewNop(), nil, nil)
	require.ErrorIs(t, err, ErrInvalid)
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(keysFile(tenantYAML("acme", "k1"), tenantYAML("beta", "k2"))))
	f.Add([]byte("tenants: [{id: a, keys: [\"sha256:" + strings.Repeat("0", 64) + "\"], weight: 2}]"))
	f.Add([]byte("tenants: null"))
	f.Add([]byte("- 1"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		set, err := Parse(raw)
		if err != nil {
			return
		}
		for _, tn := range set.Tenants() {
			if !validName(tn.ID) || tn.Weight < 1 || tn.Weight > MaxWeight || len(tn.Keys) == 0 {
				t.Fatalf("an invalid tenant was accepted: %+v", tn)
			}
		}
		_, _ = set.Lookup("k1")
	})
}

func BenchmarkLookup(b *testing.B) {
	var tenants []string
	for i := range 1000 {
		tenants = append(tenants, tenantYAML("t"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+"-"+itoa(i), "key-"+itoa(i)))
	}
	set, err := Parse([]byte(keysFile(tenants...)))
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := set.Lookup("key-500"); !ok {
			b.Fatal("not found")
		}
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var d []byte
	for ; i > 0; i /= 10 {
		d = append([]byte{byte('0' + i%10)}, d...)
	}
	return string(d)
}

// Tenant and class names travel in wire messages and NATS subjects, so the
// keys file's name rule is the wire's; tenant is a leaf and keeps its own
// copy, and this holds the two together.
func FuzzTenantNamesFollowTheWireRule(f *testing.F) {
	for _, s := range []string{"", "acme", "a-b_C9", "a.b", "a b", "ä", strings.Repeat("x", 128), strings.Repeat("x", 129)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		require.Equal(t, wire.ValidName(s), validName(s), "%q", s)
	})
}

func TestAnAdminKeyOpensOnlyTheAdminRoutesAndATenantKeyNever(t *testing.T) {
	set, err := Parse([]byte(keysFile(tenantYAML("acme", "sk-acme")) + "admins:\n  - id: prometheus\n    keys: [\"" + HashKey("sk-admin") + "\"]\n"))
	require.NoError(t, err)
	id, ok := set.LookupAdmin("sk-admin")
	require.True(t, ok)
	require.Equal(t, "prometheus", id)
	_, ok = set.Lookup("sk-admin")
	require.False(t, ok, "an admin key is not a tenant's: it cannot use the API")
	_, ok = set.LookupAdmin("sk-acme")
	require.False(t, ok, "a tenant's key does not open the admin routes")
	_, ok = set.LookupAdmin("")
	require.False(t, ok)
	require.Equal(t, []string{"prometheus"}, set.Admins())
}

func TestAnAdminKeyListedForATenantTooIsRefused(t *testing.T) {
	_, err := Parse([]byte(keysFile(tenantYAML("acme", "sk-shared")) +
		"admins:\n  - id: ops\n    keys: [\"" + HashKey("sk-shared") + "\"]\n  - id: ops\n    keys: [\"" + HashKey("x") + "\"]\n  - id: none\n"))
	require.ErrorIs(t, err, ErrInvalid)
	for _, want := range []string{"admin ops: keys[0]: the same key hash is also listed for acme", `admins[1].id "ops": duplicate`, "admin none: keys: none"} {
		require.Contains(t, err.Error(), want)
	}
}
