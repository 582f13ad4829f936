package app

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/tenant"
)

func TestTheStatusLineFitsAnEightyColumnTerminalAndClearsWhatItOverwrites(t *testing.T) {
	line := "requests 123456  admitted 123456  rejected 12  queued 3  in flight 17  indexed blocks 123456  DEGRADED 1"
	out := statusLine(line, 80)
	require.True(t, strings.HasPrefix(out, "\r"), "rewritten in place")
	require.True(t, strings.HasSuffix(out, "\x1b[K"), "erases the rest of the row")
	printed := strings.TrimSuffix(strings.TrimPrefix(out, "\r"), "\x1b[K")
	require.Len(t, printed, 79, "one column short of the width: the cursor never wraps")
	require.Equal(t, line[:79], printed)
	require.Equal(t, "\rshort\x1b[K", statusLine("short", 80), "no padding: the erase does it")
	require.Equal(t, line+"\n", statusLine(line, 0), "not a terminal: one line per refresh")
}

func TestUpWithAKeysFileAsksForAKeyAndSaysSo(t *testing.T) {
	cfg := upTestConfig(t, 1, 1)
	cfg.Replica.Tenants.KeysFile = writeKeys(t, fmt.Sprintf(`
tenants:
  - id: acme
    keys: [%q]
    models: [%s]
`, tenant.HashKey("sk-acme"), cfg.Worker.Model))
	up := startUpRun(t, cfg)
	endpoint := regexp.MustCompile(`OpenAI API  http://(\S+)/v1`)
	addr, saidKeys := "", false
	for up.lines.Scan() && !strings.HasPrefix(up.lines.Text(), "Ctrl-C") {
		if m := endpoint.FindStringSubmatch(up.lines.Text()); m != nil {
			addr = m[1]
		}
		saidKeys = saidKeys || strings.Contains(up.lines.Text(), "API keys from "+cfg.Replica.Tenants.KeysFile)
	}
	require.NotEmpty(t, addr)
	require.True(t, saidKeys, "up says where the keys come from")
	up.drain()

	post := func(key string) int {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":2}`, cfg.Worker.Model)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusUnauthorized, post(""))
	require.Equal(t, http.StatusOK, post("sk-acme"))
	up.stop(t)
}
