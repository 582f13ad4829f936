package frontend

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tokenizer"
)

// formsServer is a router over one upstream worker serving "m" that
// records every admitted request.
func formsServer(t *testing.T) (base string, up *upstream, got chan scheduler.Request) {
	t.Helper()
	got = make(chan scheduler.Request, 8)
	up = newUpstream(t, 2)
	s, _ := newTestServer(t, DefaultConfig(), Deps{
		Admitter: &fakeAdmitter{admit: func(_ context.Context, r *scheduler.Request) (Ticket, error) {
			got <- *r
			return &fakeTicket{grant: scheduler.Grant{RequestID: r.ID, Worker: "w1", WorkerURL: up.URL()}}, nil
		}},
		Workers: staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 4}},
	})
	return startServer(t, s), up, got
}

func TestNonTextContentPartsReachTheWorkerUntouchedAndShapeTheHash(t *testing.T) {
	base, up, got := formsServer(t)
	chatWith := func(image string) string {
		return `{"model":"m","max_tokens":2,"messages":[{"role":"system","content":"You look at pictures and describe them in one line."},` +
			`{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + image + `","detail":"low"}},` +
			`{"type":"text","text":"What is this?"}]}]}`
	}
	body := chatWith("iVBORw0KGgoAAAANSUhEUg")
	status, _, resp := post(t, base+"/v1/chat/completions", body, nil)
	require.Equal(t, 200, status, resp)
	a := <-got
	assert.Equal(t, body, up.lastBody.Load(), "the worker receives the client's bytes, image part included")
	assert.Equal(t, "/v1/chat/completions", up.lastPath.Load())

	status, _, _ = post(t, base+"/v1/chat/completions", body, nil)
	require.Equal(t, 200, status)
	b := <-got
	status, _, _ = post(t, base+"/v1/chat/completions", chatWith("R0lGODlhAQABAIAAAP"), nil)
	require.Equal(t, 200, status)
	c := <-got
	assert.Equal(t, a.BlockHashes, b.BlockHashes, "the same image hashes the same")
	require.NotEmpty(t, a.BlockHashes)
	n := 0
	for n < len(a.BlockHashes) && n < len(c.BlockHashes) && a.BlockHashes[n] == c.BlockHashes[n] {
		n++
	}
	assert.Positive(t, n, "the system prompt before the image still shares blocks")
	assert.Less(t, n, len(a.BlockHashes), "a different image does not share the blocks from where it sits")
}

func TestBatchedPromptsAreAdmittedOnceWithEveryPromptsLoad(t *testing.T) {
	base, up, got := formsServer(t)
	first, second := "the first prompt of the batch is here", "and a second one"
	status, _, resp := post(t, base+"/v1/completions", `{"model":"m","max_tokens":2,"prompt":["`+first+`","`+second+`"]}`, nil)
	require.Equal(t, 200, status, resp)
	r := <-got
	assert.Equal(t, len(tokenizer.Encode(first))+len(tokenizer.Encode(second)), r.PromptTokens, "the load is every prompt's tokens")
	assert.Equal(t, kvindex.SequenceHashes(tokenizer.Encode(first), 4, kvindex.ModelSeed("m")), r.BlockHashes, "the prefix is the first prompt's")
	assert.Equal(t, int32(1), up.requests.Load(), "one request to one worker")

	status, _, resp = post(t, base+"/v1/completions", `{"model":"m","max_tokens":2,"prompt":[[1,2,3,4,5],[6,7]]}`, nil)
	require.Equal(t, 200, status, resp)
	r = <-got
	assert.Equal(t, 7, r.PromptTokens)
	assert.Equal(t, kvindex.SequenceHashes([]uint32{1, 2, 3, 4, 5}, 4, kvindex.ModelSeed("m")), r.BlockHashes)
}

func TestEmbeddingsAndResponsesAreAdmittedAndProxiedToTheSamePath(t *testing.T) {
	base, up, got := formsServer(t)
	for path, body := range map[string]string{
		"/v1/embeddings": `{"model":"m","input":["alpha beta gamma delta","epsilon"]}`,
		"/v1/responses":  `{"model":"m","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hello there"}]}],"max_output_tokens":9}`,
	} {
		status, _, resp := post(t, base+path, body, nil)
		require.Equal(t, 200, status, "%s: %s", path, resp)
		r := <-got
		assert.Equal(t, path, up.lastPath.Load())
		assert.Equal(t, body, up.lastBody.Load())
		assert.Positive(t, r.PromptTokens, path)
		if path == "/v1/responses" {
			assert.Equal(t, 9, r.ExpectedOutputTokens, "max_output_tokens is the booked output")
		} else {
			assert.Equal(t, 1, r.ExpectedOutputTokens, "an embedding books no decode")
			want := tokenizer.Encode("alpha beta gamma delta")
			assert.Equal(t, kvindex.SequenceHashes(want, 4, kvindex.ModelSeed("m")), r.BlockHashes, "embedding input hashes like a completion prompt")
		}
	}
}
