package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/wire"
)

func pdWorkerConfig(t *testing.T, id, role, transfer string) WorkerConfig {
	cfg := testWorkerConfig()
	cfg.ID = id
	cfg.PD.Role, cfg.PD.KVTransfer = role, transfer
	cfg.PD.PullTimeout = 5 * time.Second
	if role == wire.RolePrefill && transfer == wire.TransferSGLang {
		// Outside the ephemeral range: a port the kernel handed out and
		// this test closed could go to another test's connection.
		cfg.PD.BootstrapPort = testenv.FreePort(t)
		cfg.PD.BootstrapListen = fmt.Sprintf("127.0.0.1:%d", cfg.PD.BootstrapPort)
	}
	return cfg
}

// postJSON posts body to url+path and returns the status and raw body.
func postJSON(t *testing.T, url, path, body, requestID string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", requestID)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// prefillLeg is the body vLLM's toy proxy sends a prefill engine.
func prefillLeg(prompt string, extra string) string {
	return fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1,"max_completion_tokens":1,"stream":false%s,`+
		`"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,`+
		`"remote_block_ids":null,"remote_host":null,"remote_port":null}}`, testModel, prompt, extra)
}

// decodeLeg is the original body with the prefill's parameters copied in
// unchanged (raw bytes).
func decodeLeg(prompt string, params json.RawMessage) string {
	return fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":6,"stream":true,"kv_transfer_params":%s}`, testModel, prompt, params)
}

func (w *runningWorker) kvTransfers(outcome string) float64 {
	mfs, _ := w.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "switchyard_worker_kv_transfers_total" {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					sum += m.GetCounter().GetValue()
				}
			}
		}
		return sum
	}
	return 0
}

func TestAVLLMPrefillAnswersKVTransferParamsThatADecodeWorkerPullsOnce(t *testing.T) {
	p := startWorker(t, pdWorkerConfig(t, "p1", wire.RolePrefill, wire.TransferVLLM))
	d := startWorker(t, pdWorkerConfig(t, "d1", wire.RoleDecode, wire.TransferVLLM))
	prompt := workerLongPrompt("disaggregation")

	status, body := postJSON(t, p.url, "/v1/completions", prefillLeg(prompt, ""), "req-1")
	require.Equal(t, http.StatusOK, status, string(body))
	var pre struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	require.NoError(t, json.Unmarshal(body, &pre))
	require.Equal(t, "length", pre.Choices[0].FinishReason)
	var params map[string]any
	require.NoError(t, json.Unmarshal(pre.KVTransferParams, &params))
	for _, k := range []string{"do_remote_prefill", "do_remote_decode", "remote_engine_id", "remote_block_ids",
		"remote_request_id", "remote_host", "remote_port", "tp_size"} {
		require.Contains(t, params, k)
	}
	require.Equal(t, true, params["do_remote_prefill"])
	require.Equal(t, "req-1", params["remote_request_id"])
	require.Equal(t, 1.0, p.kvTransfers(kvHeld))

	// The decode leg, streamed, with the parameters byte for byte.
	status, body = postJSON(t, d.url, "/v1/completions", decodeLeg(prompt, pre.KVTransferParams), "req-1")
	require.Equal(t, http.StatusOK, status, string(body))
	require.Equal(t, 6, strings.Count(string(body), `"text"`), string(body))
	require.Contains(t, string(body), "data: [DONE]")
	require.Equal(t, 1.0, d.kvTransfers(kvPulled))
	require.Equal(t, 1.0, p.kvTransfers(kvServed))

	// The KV went to the first pull: a second decode finds none.
	status, body = postJSON(t, d.url, "/v1/completions", decodeLeg(prompt, pre.KVTransferParams), "req-1b")
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, string(body), "kv_transfer_missing")
	require.Equal(t, 1.0, d.kvTransfers(kvMissing))
}

func TestAPrefillWhoseOneTokenEndsTheSequenceReturnsNoParameters(t *testing.T) {
	p := startWorker(t, pdWorkerConfig(t, "p1", wire.RolePrefill, wire.TransferVLLM))
	status, body := postJSON(t, p.url, "/v1/completions", prefillLeg("short answer", `,"sim_stop_after":1`), "req-eos")
	require.Equal(t, http.StatusOK, status, string(body))
	var pre map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &pre))
	require.NotContains(t, pre, "kv_transfer_params")
	require.Contains(t, string(pre["choices"]), `"finish_reason":"stop"`)
	require.Equal(t, 1.0, p.kvTransfers(kvNoParams))
	require.Equal(t, 0.0, p.kvTransfers(kvHeld))
}

func TestADecodeRejectsParametersItCannotUseWithTypedErrors(t *testing.T) {
	d := startWorker(t, pdWorkerConfig(t, "d1", wire.RoleDecode, wire.TransferVLLM))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedPort := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	cases := map[string]struct {
		params  string
		code    string
		outcome string
	}{
		"fields missing": {`{"do_remote_prefill":true,"remote_engine_id":"e"}`, "invalid_kv_transfer_params", kvMalformed},
		"not an object":  {`[1,2]`, "invalid_kv_transfer_params", ""},
		"both flags":     {`{"do_remote_prefill":true,"do_remote_decode":true}`, "invalid_kv_transfer_params", ""},
		"unreachable": {fmt.Sprintf(`{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r",`+
			`"remote_host":"127.0.0.1","remote_port":%d,"remote_block_ids":[0]}`, closedPort), "kv_transfer_unreachable", kvUnreachable},
		"a prefill leg on a decode worker": {`{"do_remote_decode":true}`, "kv_transfer_unsupported", kvWrongRole},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			before := d.kvTransfers(c.outcome)
			status, body := postJSON(t, d.url, "/v1/completions", decodeLeg("hello", json.RawMessage(c.params)), "r-"+name)
			require.Equal(t, http.StatusBadRequest, status, string(body))
			require.Contains(t, string(body), c.code)
			if c.outcome != "" {
				require.Equal(t, before+1, d.kvTransfers(c.outcome))
			}
		})
	}
}

func TestAnSGLangDecodeWaitsForItsRoomOnThePrefillsBootstrapPort(t *testing.T) {
	pcfg := pdWorkerConfig(t, "p1", wire.RolePrefill, wire.TransferSGLang)
	p := startWorker(t, pcfg)
	d := startWorker(t, pdWorkerConfig(t, "d1", wire.RoleDecode, wire.TransferSGLang))
	port := pcfg.PD.BootstrapPort
	prompt := workerLongPrompt("bootstrap")
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":5,"stream":true,`+
		`"bootstrap_host":"127.0.0.1","bootstrap_port":%d,"bootstrap_room":9223372036854775807}`, testModel, prompt, port)

	// The decode goes first and waits; the prefill then fills the room.
	type answer struct {
		status int
		body   []byte
	}
	dec := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			dec <- answer{0, []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		dec <- answer{resp.StatusCode, b}
	}()
	status, pre := postJSON(t, p.url, "/v1/chat/completions", body, "room")
	require.Equal(t, http.StatusOK, status, string(pre))
	a := <-dec
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	require.Equal(t, 5, strings.Count(string(a.body), `"content"`), string(a.body))
	require.Equal(t, 1.0, d.kvTransfers(kvPulled))
	require.Equal(t, 1.0, p.kvTransfers(kvServed))
}

func TestAnSGLangRoomThatNeverComesTimesOutWithATypedError(t *testing.T) {
	pcfg := pdWorkerConfig(t, "p1", wire.RolePrefill, wire.TransferSGLang)
	startWorker(t, pcfg)
	cfg := pdWorkerConfig(t, "d1", wire.RoleDecode, wire.TransferSGLang)
	cfg.PD.PullTimeout = 200 * time.Millisecond
	d := startWorker(t, cfg)
	body := fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":3,"bootstrap_host":"127.0.0.1","bootstrap_port":%d,"bootstrap_room":7}`,
		testModel, pcfg.PD.BootstrapPort)
	status, b := postJSON(t, d.url, "/v1/completions", body, "lost")
	require.Equal(t, http.StatusGatewayTimeout, status, string(b))
	require.Contains(t, string(b), "kv_transfer_timeout")
	require.Equal(t, 1.0, d.kvTransfers(kvTimeout))
}

func TestTheWorkerFlagsSetTheRoleAndAreValidated(t *testing.T) {
	fs, cfg, _ := workerFlags()
	require.NoError(t, fs.Parse([]string{"-role", "prefill", "-kv-transfer", "sglang", "-bootstrap-port", "8998", "-transfer-gbps", "400"}))
	require.Equal(t, wire.RolePrefill, cfg.PD.Role)
	require.Equal(t, wire.TransferSGLang, cfg.PD.KVTransfer)
	require.Equal(t, 8998, cfg.PD.BootstrapPort)
	require.NoError(t, cfg.Validate())
	cfg.PD.BootstrapPort = 0
	require.ErrorContains(t, cfg.Validate(), "bootstrap-port")
	cfg.PD.Role = "encode"
	require.ErrorContains(t, cfg.Validate(), "Role")
}

// The official client passes kv_transfer_params through as an extra field.
func TestTheOfficialClientCarriesKVTransferParams(t *testing.T) {
	p := startWorker(t, pdWorkerConfig(t, "p1", wire.RolePrefill, wire.TransferVLLM))
	c := openai.NewClient(option.WithBaseURL(p.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	var raw bytes.Buffer
	_, err := c.Completions.New(t.Context(), openai.CompletionNewParams{
		Model: openai.CompletionNewParamsModel(testModel), Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello there")},
		MaxTokens: openai.Int(1),
	}, option.WithJSONSet("kv_transfer_params", map[string]any{"do_remote_decode": true}),
		option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			resp, err := next(r)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				raw.Write(b)
				resp.Body = io.NopCloser(bytes.NewReader(b))
			}
			return resp, err
		}))
	require.NoError(t, err)
	require.Contains(t, raw.String(), `"kv_transfer_params":{`)
}

func TestRoleWorkersRegisterTheirRoleTransferAndBootstrapPort(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	cli := etcd.Client(t)
	pcfg := pdWorkerConfig(t, "p1", wire.RolePrefill, wire.TransferSGLang)
	pcfg.EtcdEndpoints = etcd.Endpoints
	startWorker(t, pcfg)
	dcfg := pdWorkerConfig(t, "d1", wire.RoleDecode, wire.TransferVLLM)
	dcfg.EtcdEndpoints = etcd.Endpoints
	startWorker(t, dcfg)
	bcfg := pdWorkerConfig(t, "b1", wire.RoleBoth, wire.TransferVLLM)
	bcfg.EtcdEndpoints = etcd.Endpoints
	startWorker(t, bcfg)
	read := func(id string) *wire.WorkerInfo {
		resp, err := cli.Get(testenv.Context(t), wire.NewKeys("test").Worker(id))
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1)
		info, err := wire.DecodeWorkerInfo(resp.Kvs[0].Value)
		require.NoError(t, err)
		return info
	}
	p := read("p1")
	require.Equal(t, []any{wire.RolePrefill, wire.TransferSGLang, pcfg.PD.BootstrapPort}, []any{p.Role, p.KVTransfer, p.BootstrapPort})
	d := read("d1")
	require.Equal(t, []any{wire.RoleDecode, wire.TransferVLLM, 0}, []any{d.Role, d.KVTransfer, d.BootstrapPort})
	b := read("b1")
	require.Equal(t, wire.RoleBoth, b.RoleOf())
	require.Empty(t, b.KVTransfer, "a worker of role both registers as every worker did before roles")
}

// BenchmarkParseGenRequest measures what the disaggregation fields add to
// decoding a request body: the same prompt plain, as a vLLM prefill leg,
// and as a decode leg carrying the prefill's parameters.
func BenchmarkParseGenRequest(b *testing.B) {
	reg := simPrompts(b, "m")
	tok := func(model string, in *prompt.Input) ([][]uint32, error) { return reg.TokenizeEach(model, in) }
	p := workerLongPrompt("bench")
	bodies := map[string]string{
		"plain":   fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":16}`, p),
		"prefill": fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`, p),
		"decode": fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":16,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"p1-00000000000000ab","remote_block_ids":[%s],"remote_request_id":"r","remote_host":"10.0.0.1","remote_port":9000,"tp_size":1}}`,
			p, strings.TrimSuffix(strings.Repeat("1,", 48), ",")),
	}
	for _, name := range []string{"plain", "prefill", "decode"} {
		body := []byte(bodies[name])
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, e := parseGenRequest(body, prompt.KindCompletion, tok, 16, 100000); e != nil {
					b.Fatal(e.Message)
				}
			}
		})
	}
}

// A decode engine publishes the blocks it received as stored, as a vLLM
// decode engine with KV events does: routers index them under the decode
// worker.
func TestADecodeWorkerPublishesTheTransferredBlocksAsStored(t *testing.T) {
	nt := testenv.StartNATS(t)
	nc := nt.Conn(t)
	kvSub, err := nc.SubscribeSync(wire.NewSubjects("test").KV("d1"))
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	p := startWorker(t, pdWorkerConfig(t, "p1", wire.RolePrefill, wire.TransferVLLM))
	dcfg := pdWorkerConfig(t, "d1", wire.RoleDecode, wire.TransferVLLM)
	dcfg.NATSURL = nt.URL
	d := startWorker(t, dcfg)
	text := workerLongPrompt("transferred")

	status, body := postJSON(t, p.url, "/v1/completions", prefillLeg(text, ""), "req-ev")
	require.Equal(t, http.StatusOK, status, string(body))
	var pre struct {
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	require.NoError(t, json.Unmarshal(body, &pre))
	decode := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":3,"kv_transfer_params":%s}`, testModel, text, pre.KVTransferParams)
	status, body = postJSON(t, d.url, "/v1/completions", decode, "req-ev")
	require.Equal(t, http.StatusOK, status, string(body))

	want := kvindex.SequenceHashes(simTokens(t, testModel, prompt.KindCompletion, `{"prompt":"`+text+`"}`), 16, kvindex.ModelSeed(testModel))
	stored := map[uint64]bool{}
	for !hasAllHashes(stored, want) {
		msg, err := kvSub.NextMsg(5 * time.Second)
		require.NoError(t, err, "the decode's stored events did not arrive")
		b, err := wire.DecodeKVEventBatch(msg.Data)
		require.NoError(t, err)
		for _, ev := range b.Events {
			if ev.Kind == wire.KVStored {
				for _, h := range ev.Hashes {
					stored[h] = true
				}
			}
		}
	}
}
