package app

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/wire"
)

func TestUpPDReadsTheFleetShapeAndRaisesTheWorkers(t *testing.T) {
	fs, resolve := upFlags()
	require.NoError(t, fs.Parse([]string{"-pd", "2P3D", "-kv-transfer", "sglang"}))
	cfg, _, err := resolve()
	require.NoError(t, err)
	require.Equal(t, []int{2, 3, 8}, []int{cfg.PDPrefill, cfg.PDDecode, cfg.Workers}, "the default 8 workers hold 2P3D")
	require.Equal(t, wire.TransferSGLang, cfg.PDTransfer)
	require.NoError(t, cfg.validatePD())
	require.Equal(t, "  disaggregated (sglang protocol): worker-1..2 prefill, worker-3..5 decode, worker-6..8 both (aggregated requests)\n", pdBanner(cfg))

	fs, resolve = upFlags()
	require.NoError(t, fs.Parse([]string{"-pd", "3p3d", "-workers", "4"}))
	cfg, _, err = resolve()
	require.NoError(t, err)
	require.Equal(t, 6, cfg.Workers, "-workers grows to x+y")
	require.Equal(t, wire.TransferVLLM, cfg.PDTransfer)

	for _, bad := range []string{"2P", "0P2D", "2D2P", "xPyD"} {
		fs, resolve = upFlags()
		require.NoError(t, fs.Parse([]string{"-pd", bad}))
		_, _, err = resolve()
		require.Error(t, err, bad)
	}
	cfg.Protocol = ProtocolVLLM
	require.Error(t, cfg.validatePD(), "-pd runs native workers")
	cfg.Protocol, cfg.PDTransfer = ProtocolNative, "nixl"
	require.Error(t, cfg.validatePD())
}

func TestUpPDRunsALongPromptAsAnSGLangPairAndAShortOneAggregated(t *testing.T) {
	cfg := upTestConfig(t, 1, 3)
	cfg.PDPrefill, cfg.PDDecode, cfg.PDTransfer = 1, 1, wire.TransferSGLang
	cfg.Replica.Scheduler.Disagg.MinTokens = 64
	up := startUpRun(t, cfg)
	endpoint := regexp.MustCompile(`OpenAI API  http://(\S+)/v1`)
	addr, banner := "", ""
	for up.lines.Scan() && (addr == "" || banner == "") {
		if m := endpoint.FindStringSubmatch(up.lines.Text()); m != nil {
			addr = m[1]
		}
		if strings.Contains(up.lines.Text(), "disaggregated") {
			banner = up.lines.Text()
		}
	}
	up.drain()
	require.NotEmpty(t, addr)
	require.Equal(t, "  disaggregated (sglang protocol): worker-1 prefill, worker-2 decode, worker-3 both (aggregated requests)", banner)
	api := "http://" + addr
	testenv.Eventually(t, 20*time.Second, func() bool { return modelWorkers(api) == 3 }, "the router sees the three workers")

	complete := func(prompt string) {
		body, _ := json.Marshal(map[string]any{"model": cfg.Worker.Model, "prompt": prompt, "max_tokens": 4})
		resp, err := http.Post(api+"/v1/completions", "application/json", strings.NewReader(string(body)))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		require.Contains(t, string(b), `"completion_tokens":4`)
	}
	complete(strings.Repeat("a long shared context ", 60))
	complete("hi")

	resp, err := http.Get(api + "/metrics")
	require.NoError(t, err)
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	decided := func(mode, reason string) *regexp.Regexp {
		return regexp.MustCompile(metrics.NameDisaggDecisions + `\{[^}]*mode="` + mode + `"[^}]*reason="` + reason + `"[^}]*\} 1\n`)
	}
	require.Regexp(t, decided("disaggregated", "long_prefill"), string(m))
	require.Regexp(t, decided("aggregated", "short_prefill"), string(m))
	up.stop(t)
}
