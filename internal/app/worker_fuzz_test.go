package app

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/prompt"
)

// simPrompts is the prompt registry of a simulated worker serving model
// with the default (real, built-in) tokenizer.
func simPrompts(tb testing.TB, model string) *prompt.Registry {
	tb.Helper()
	cfg := DefaultWorkerConfig()
	cfg.Model = model
	reg, err := newWorkerPrompts(cfg, zap.NewNop())
	require.NoError(tb, err)
	return reg
}

// FuzzDecodeGenRequest checks that no body makes the request decoder panic,
// that every rejection is a 4xx OpenAI error, and that every accepted request
// is servable (a prompt, and output that fits the context).
func FuzzDecodeGenRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","prompt":["one"]}`,
		`{"model":"m","prompt":["a","b"]}`,
		`{"model":"m","prompt":[4294967296]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null}]}`,
		`{"model":"m","prompt":"x","n":2}`,
		`{"model":"m","prompt":"x","priority":99999999999}`,
		`{"model":"m","prompt":"x","max_tokens":-1}`,
		`{"model":"m","input":["a","b"],"encoding_format":"base64"}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":4}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"model":"m","prompt":"x","temperature":2.5,"logprobs":3}`,
		`{"model":"m","messages":[{"role":"user","content":"a"}],"logprobs":true,"top_logprobs":2,"response_format":{"type":"json_object"}}`,
		`{"model":"m","prompt":"x","temperature":1e300,"logprobs":"x"}`,
		`{"model":"m","prompt":"x","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"remote_engine_id":null}}`,
		`{"model":"m","prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[0,1],"remote_host":"h","remote_port":1,"remote_request_id":"r","tp_size":1}}`,
		`{"model":"m","prompt":"x","kv_transfer_params":null,"sim_stop_after":1}`,
		`{"model":"m","prompt":"x","bootstrap_host":"h","bootstrap_port":8998,"bootstrap_room":9223372036854775807}`,
		`{"model":"m","prompt":"x","bootstrap_host":"h","bootstrap_port":8998,"bootstrap_room":18446744073709551615}`,
		`{"model":1}`,
		`{} {}`,
		``,
	} {
		for k := prompt.KindCompletion; k <= prompt.KindResponse; k++ {
			f.Add([]byte(s), uint8(k))
		}
	}
	reg := simPrompts(f, "m")
	tok := func(model string, in *prompt.Input) ([][]uint32, error) { return reg.TokenizeEach(model, in) }
	f.Fuzz(func(t *testing.T, body []byte, k uint8) {
		kind := prompt.Kind(k%4 + 1)
		req, apiErr := parseGenRequest(body, kind, tok, 16, 1000)
		if apiErr != nil {
			require.Nil(t, req)
			require.GreaterOrEqual(t, apiErr.Status, 400)
			require.Less(t, apiErr.Status, 500)
			require.NotEmpty(t, apiErr.Message)
			require.NotEmpty(t, apiErr.Code)
			return
		}
		require.NotEmpty(t, req.Model)
		require.NotEmpty(t, req.Prompts)
		require.True(t, req.N >= 1 && req.N <= maxWorkerN, "n %d", req.N)
		for _, p := range req.Prompts {
			require.NotEmpty(t, p)
			require.LessOrEqual(t, len(p)+req.MaxTokens, 1000)
		}
		if kind != prompt.KindEmbedding {
			require.GreaterOrEqual(t, req.MaxTokens, 1)
		}
	})
}

// simTokens is what a simulated worker serving model tokenizes a request's
// prompt part to (fields as a JSON object, e.g. {"prompt":"hi"}).
func simTokens(tb testing.TB, model string, kind prompt.Kind, fields string) []uint32 {
	tb.Helper()
	var f prompt.Fields
	require.NoError(tb, json.Unmarshal([]byte(fields), &f))
	in, err := prompt.Parse(kind, &f)
	require.NoError(tb, err)
	ids, err := simPrompts(tb, model).TokenizeEach(model, in)
	require.NoError(tb, err)
	return ids[0]
}
