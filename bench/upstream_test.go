package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// completionBody is what the test upstream decodes from each request.
type completionBody struct {
	Model         string   `json:"model"`
	Prompt        []uint32 `json:"prompt"`
	MaxTokens     int      `json:"max_tokens"`
	Stream        bool     `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type seenRequest struct {
	Path   string
	Header http.Header
	Body   completionBody
}

// upstream is a real HTTP server speaking the OpenAI completions streaming
// protocol, standing in for a router or engine. respond decides the answer;
// by default it streams max_tokens one-character chunks, a usage chunk that
// reports CachedTokens cached prompt tokens, and [DONE].
type upstream struct {
	*httptest.Server
	Worker       string
	CachedTokens int
	respond      func(w http.ResponseWriter, r *http.Request, body completionBody)

	mu   sync.Mutex
	seen []seenRequest
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{Worker: "worker-a"}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(r.Body)
	var body completionBody
	if err == nil {
		err = json.Unmarshal(raw, &body)
	}
	if err != nil {
		http.Error(w, `{"error":{"message":"bad body","type":"invalid_request_error","code":null}}`, http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.seen = append(u.seen, seenRequest{Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	u.mu.Unlock()
	if u.respond != nil {
		u.respond(w, r, body)
		return
	}
	u.streamOK(w, body)
}

func (u *upstream) streamOK(w http.ResponseWriter, body completionBody) {
	w.Header().Set("Content-Type", "text/event-stream")
	if u.Worker != "" {
		w.Header().Set("X-Switchyard-Routed-Worker", u.Worker)
	}
	fl := w.(http.Flusher)
	for i := 0; i < body.MaxTokens; i++ {
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"t%d\",\"finish_reason\":null}]}\n\n", i)
		fl.Flush()
	}
	if body.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
			len(body.Prompt), body.MaxTokens, len(body.Prompt)+body.MaxTokens, u.CachedTokens)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	fl.Flush()
}

func (u *upstream) requests() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seenRequest(nil), u.seen...)
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.seen)
}

// writeOpenAIError answers with an OpenAI-shaped error.
func writeOpenAIError(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"message":"rejected: %s","type":"rate_limit_error","param":null,"code":%q}}`, code, code)
}

// collect gathers results from Runner.Run's sink.
type collect struct {
	mu  sync.Mutex
	res []Result
}

func (c *collect) sink(r Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.res = append(c.res, r)
}

// byIndex returns the results ordered by request index.
func (c *collect) byIndex(t *testing.T, n int) []Result {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Len(t, c.res, n)
	out := make([]Result, n)
	for _, r := range c.res {
		require.Less(t, r.Index, n)
		out[r.Index] = r
	}
	return out
}
