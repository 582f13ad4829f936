package prompt

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/tokenizer"
)

func TestADeadEngineIsSkippedForTheNextHealthyOneNotTheApproximatePath(t *testing.T) {
	tok, err := tokenizer.Open("tiktoken:cl100k_base")
	require.NoError(t, err)
	var healthy atomic.Bool
	live, liveCalls := vllmTokenizer(t, tok, &healthy)
	var deadCalls atomic.Int64
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		deadCalls.Add(1)
		http.Error(w, "engine is down", http.StatusServiceUnavailable)
	}))
	t.Cleanup(dead.Close)
	now := time.Unix(1000, 0)
	cfg := DefaultConfig()
	r, err := NewRegistry(cfg, Deps{Now: func() time.Time { return now }}, zaptest.NewLogger(t), prometheus.NewRegistry())
	require.NoError(t, err)
	engines := []string{dead.URL, live.URL}

	// Enough distinct prompts that some hash to the dead engine first.
	for _, text := range []string{"one", "two", "three", "four", "five", "six", "seven", "eight"} {
		res, err := r.Tokenize(context.Background(), "remote", parse(t, KindCompletion, `{"prompt":"`+text+`"}`), engines)
		require.NoError(t, err)
		assert.Equal(t, PathEngine, res.Path, "%q is tokenized by the live engine", text)
		assert.Equal(t, tok.Encode(text), res.IDs.Slice())
	}
	assert.Equal(t, int64(1), deadCalls.Load(), "the dead engine costs one attempt, then is skipped for the back-off")
	assert.Equal(t, int64(8), liveCalls.Load())

	now = now.Add(cfg.EngineBackoff)
	for _, text := range []string{"nine", "ten", "eleven", "twelve", "thirteen", "fourteen"} {
		res, err := r.Tokenize(context.Background(), "remote", parse(t, KindCompletion, `{"prompt":"`+text+`"}`), engines)
		require.NoError(t, err)
		assert.Equal(t, PathEngine, res.Path)
	}
	assert.Equal(t, int64(2), deadCalls.Load(), "after the back-off the dead engine is tried once more")
}

func TestWhenEveryEngineFailsTheModelIsApproximatedAfterBoundedAttempts(t *testing.T) {
	var calls atomic.Int64
	var urls []string
	for range 5 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			calls.Add(1)
			http.Error(w, "down", http.StatusServiceUnavailable)
		}))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	cfg := DefaultConfig()
	r, err := NewRegistry(cfg, Deps{}, zaptest.NewLogger(t), prometheus.NewRegistry())
	require.NoError(t, err)
	res, err := r.Tokenize(context.Background(), "remote", parse(t, KindCompletion, `{"prompt":"hello"}`), urls)
	require.NoError(t, err)
	assert.Equal(t, PathApproximate, res.Path)
	assert.Equal(t, int64(cfg.EngineAttempts), calls.Load(), "at most EngineAttempts engines are asked")
	_, err = r.Tokenize(context.Background(), "remote", parse(t, KindCompletion, `{"prompt":"again"}`), urls)
	require.NoError(t, err)
	assert.Equal(t, int64(cfg.EngineAttempts), calls.Load(), "then the model backs off")
}
