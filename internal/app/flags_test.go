package app

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flagSubcommand builds a subcommand's flag set bound to a fresh default
// config and returns it with a function that reads back the effective
// configuration (everything the subcommand runs with).
type flagSubcommand struct {
	name  string
	build func() (*flag.FlagSet, func() (any, error))
}

func flagSubcommands() []flagSubcommand {
	return []flagSubcommand{
		{"router", func() (*flag.FlagSet, func() (any, error)) {
			fs, resolve := routerFlags()
			return fs, func() (any, error) { c, l, err := resolve(); return []any{c, l}, err }
		}},
		{"up", func() (*flag.FlagSet, func() (any, error)) {
			fs, resolve := upFlags()
			return fs, func() (any, error) { c, l, err := resolve(); return []any{c, l}, err }
		}},
		{"worker", func() (*flag.FlagSet, func() (any, error)) {
			fs, c, l := workerFlags()
			return fs, func() (any, error) { return []any{*c, *l}, nil }
		}},
		{"adapter", func() (*flag.FlagSet, func() (any, error)) {
			fs, c, lk, l := adapterFlags()
			return fs, func() (any, error) { return []any{*c, *lk, *l}, nil }
		}},
	}
}

// nonDefaultFlagValue is a value of f other than its default: derived from
// the flag's type, or from the table for flags whose values have a syntax.
func nonDefaultFlagValue(t *testing.T, f *flag.Flag, special map[string]string) (string, bool) {
	if v, ok := special[f.Name]; ok {
		return v, true
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return "", false
	}
	switch v := g.Get().(type) {
	case bool:
		return strconv.FormatBool(!v), true
	case int:
		return strconv.Itoa(v + 7), true
	case int64:
		return strconv.FormatInt(v+7, 10), true
	case uint:
		return strconv.FormatUint(uint64(v+7), 10), true
	case uint64:
		return strconv.FormatUint(v+7, 10), true
	case float64:
		return strconv.FormatFloat(v+0.5, 'g', -1, 64), true
	case time.Duration:
		return (v + 7*time.Second).String(), true
	case string:
		return v + "-changed", true
	}
	return "", false
}

func TestEveryFlagOfEverySubcommandChangesTheConfigurationItNames(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	policy := file("policy.yaml", "classes: []\n")
	keyring := file("keyring", "AAAAAAAAAAAAAAAAAAAAAA==\n")
	// Flags whose values have a syntax of their own (lists, keys, levels).
	special := map[string]string{
		"etcd-endpoints":       "http://10.0.0.1:2379,http://10.0.0.2:2379",
		"served-model-names":   "alias-a,alias-b",
		"gossip.join":          "10.0.0.1:7946",
		"gossip.secret-key":    "AAAAAAAAAAAAAAAAAAAAAA==",
		"gossip.keyring-file":  keyring,
		"log-level":            "debug",
		"policy":               policy,
		"protocol":             ProtocolVLLM,
		"tokenizer":            "m=tiktoken:cl100k_base",
		"tokenizer.map":        "m=tiktoken:cl100k_base",
		"sched.selector":       "blocks",
		"sched.ttft-prefill":   "1,2,3",
		"sched.ttft-decode":    "1,2,3",
		"engine":               "sglang",
		"models":               "alias-a,alias-b",
		"labels":               "zone=a,rack=b",
		"http.session-headers": "x-session-id,X-Dynamo-Session-ID",
		"engine-apis":          "anthropic-messages",
		"pd":                   "2P2D",
	}
	for _, sc := range flagSubcommands() {
		fs, read := sc.build()
		require.NoError(t, fs.Parse(nil))
		def, err := read()
		require.NoError(t, err)
		fs.VisitAll(func(f *flag.Flag) {
			v, ok := nonDefaultFlagValue(t, f, special)
			if !assert.Truef(t, ok, "switchyard %s -%s: no non-default value known; add one to the test's table", sc.name, f.Name) {
				return
			}
			fs2, read2 := sc.build()
			fs2.SetOutput(io.Discard)
			if !assert.NoErrorf(t, fs2.Parse([]string{"-" + f.Name + "=" + v}), "switchyard %s -%s=%s", sc.name, f.Name, v) {
				return
			}
			got, err := read2()
			require.NoError(t, err)
			assert.Falsef(t, reflect.DeepEqual(def, got),
				"switchyard %s -%s=%s is accepted and ignored: the configuration equals the default", sc.name, f.Name, v)
		})
	}
}

func TestARemovedRouterFlagFailsWithWhatReplacesIt(t *testing.T) {
	var stderr bytes.Buffer
	err := Router(t.Context(), []string{"-id", "r1", "-http.addr", "0.0.0.0:9999"}, io.Discard, &stderr)
	require.ErrorIs(t, err, ErrUsage)
	assert.Contains(t, stderr.String(), "-http.addr was removed: -http-addr ADDR is the API's listen address")
}

func TestTheRouterListensWhereHTTPAddrSays(t *testing.T) {
	fs, resolve := routerFlags()
	require.NoError(t, fs.Parse([]string{"-http-addr", "0.0.0.0:9999"}))
	cfg, _, err := resolve()
	require.NoError(t, err)
	assert.Equal(t, "0.0.0.0:9999", cfg.HTTPAddr)
	assert.Equal(t, "0.0.0.0:9999", cfg.Frontend.Addr, "the frontend's config names the same address")
}
