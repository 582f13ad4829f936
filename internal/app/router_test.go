package app

// Single-replica specifications of the router's request path, end to end:
// real embedded etcd and NATS (testenv), real simulated workers (RunWorker),
// a real replica (RunReplica) and the official OpenAI Go client. The
// cluster harness (testCluster) is shared with cluster_test.go.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// routerTestCluster is one replica ("r1", owning every class) over the given
// workers (started by the caller with addWorker).
func routerTestCluster(t *testing.T) *testCluster {
	return newTestCluster(t, 0)
}

// addWorker starts a worker registered in c's etcd and NATS; mutate adjusts
// its config first.
func (c *testCluster) addWorker(id string, mutate func(*WorkerConfig)) *runningWorker {
	cfg := testWorkerConfig()
	cfg.ID = id
	cfg.EtcdEndpoints = c.etcd.Endpoints
	cfg.NATSURL = c.nats.URL
	if mutate != nil {
		mutate(&cfg)
	}
	w := startWorker(c.t, cfg)
	c.mu.Lock()
	c.workers = append(c.workers, w)
	c.mu.Unlock()
	return w
}

// startOwner starts replica r1 and waits until it owns every class and sees
// n workers.
func (c *testCluster) startOwner(n int) *runningReplica {
	r := c.startReplica("r1")
	c.waitOwned(defaultClasses, "r1")
	testenv.Eventually(c.t, 10*time.Second, func() bool {
		return modelWorkers("http://"+r.status.HTTPAddr) == n
	}, "the replica sees %d workers", n)
	return r
}

// modelWorkers is the worker count /v1/models at base reports for the one
// model the tests serve, or -1 when it cannot be read.
func modelWorkers(base string) int {
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			Workers int `json:"switchyard_workers"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&list) != nil || len(list.Data) != 1 {
		return -1
	}
	return list.Data[0].Workers
}

func TestStreamingAndNonStreamingCompletionsThroughTheRouterWithTheOpenAIClient(t *testing.T) {
	c := routerTestCluster(t)
	c.addWorker("w1", nil)
	c.addWorker("w2", nil)
	r := c.startOwner(2)
	cl := r.client()
	ctx := testenv.Context(t)

	comp, err := cl.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens: openai.Int(8),
	})
	require.NoError(t, err)
	require.Len(t, comp.Choices, 1)
	assert.NotEmpty(t, comp.Choices[0].Text)
	assert.Equal(t, int64(8), comp.Usage.CompletionTokens)

	chat, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     testModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
		MaxTokens: openai.Int(5),
	})
	require.NoError(t, err)
	require.Len(t, chat.Choices, 1)
	assert.NotEmpty(t, chat.Choices[0].Message.Content)

	stream := cl.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         testModel,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("stream please")},
		MaxTokens:     openai.Int(6),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var text strings.Builder
	var usage openai.CompletionUsage
	chunks := 0
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
			chunks++
		}
		if ch.Usage.TotalTokens > 0 {
			usage = ch.Usage
		}
	}
	require.NoError(t, stream.Err())
	assert.GreaterOrEqual(t, chunks, 2, "tokens arrive as separate events")
	assert.NotEmpty(t, text.String())
	assert.Equal(t, int64(6), usage.CompletionTokens, "usage passes through")

	cstream := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1000, 1001, 1002, 1003}},
		MaxTokens: openai.Int(4),
	})
	n := 0
	for cstream.Next() {
		n++
	}
	require.NoError(t, cstream.Err())
	assert.GreaterOrEqual(t, n, 1, "a token-array prompt streams")

	snap, err := r.status.Flush(ctx)
	require.NoError(t, err)
	testenv.Eventually(t, 5*time.Second, func() bool {
		s, err := r.status.Flush(ctx)
		return err == nil && s.Bookings == 0
	}, "every booking is finished once the responses are done")
	assert.Equal(t, uint64(4), snap.Classes["interactive"].Counters.Admitted)
}

func TestASecondRequestSharingALongPrefixLandsOnTheSameWorkerAndReportsCachedTokens(t *testing.T) {
	c := routerTestCluster(t)
	for i := 1; i <= 3; i++ {
		c.addWorker("w"+strconv.Itoa(i), nil)
	}
	r := c.startOwner(3)
	cl := r.client()
	ctx := testenv.Context(t)
	prefix := workerLongPrompt("switchyards")

	var first, second *http.Response
	_, err := cl.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prefix + " First question?")},
		MaxTokens: openai.Int(4),
	}, option.WithResponseInto(&first))
	require.NoError(t, err)
	resp, err := cl.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prefix + " Second question?")},
		MaxTokens: openai.Int(4),
	}, option.WithResponseInto(&second))
	require.NoError(t, err)

	w1 := first.Header.Get("X-Switchyard-Routed-Worker")
	require.NotEmpty(t, w1)
	assert.Equal(t, w1, second.Header.Get("X-Switchyard-Routed-Worker"), "the shared prefix pulls the request to the same worker")
	assert.Greater(t, resp.Usage.PromptTokensDetails.CachedTokens, int64(512), "the worker served the shared prefix from its cache")
	assert.Greater(t, resp.Usage.PromptTokens, resp.Usage.PromptTokensDetails.CachedTokens)
}

// busyCluster is one replica over one worker that runs one request at a
// time, slowly enough that a second request has to queue at the router.
func busyCluster(t *testing.T) (*testCluster, *runningReplica) {
	c := routerTestCluster(t)
	c.addWorker("w1", func(cfg *WorkerConfig) {
		cfg.Engine.MaxNumSeqs = 1 // the scheduler books at most one request on it
		cfg.Engine.Speedup = 10
	})
	return c, c.startOwner(1)
}

// occupy starts a long streaming request and returns once its first token
// arrived (so it holds the worker's only slot); wait returns its outcome.
func occupy(t *testing.T, r *runningReplica) (wait func() error) {
	ctx := testenv.Context(t)
	cl := r.client()
	stream := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("occupy the worker")},
		MaxTokens: openai.Int(1000),
	})
	require.True(t, stream.Next(), "first token of the occupying request: %v", stream.Err())
	done := make(chan error, 1)
	go func() {
		for stream.Next() {
		}
		done <- stream.Err()
	}()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() { err = <-done })
		return err
	}
}

func TestADeadlineThatCannotBeMetIsRejectedWith429DeadlineExceeded(t *testing.T) {
	_, r := busyCluster(t)
	wait := occupy(t, r)

	cl := r.client()
	_, err := cl.Completions.New(testenv.Context(t), openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("too late")},
		MaxTokens: openai.Int(4),
	}, option.WithHeader("x-switchyard-deadline-ms", "30"))
	var apiErr *openai.Error
	require.True(t, errors.As(err, &apiErr), "an OpenAI API error: %v", err)
	assert.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
	assert.Equal(t, "deadline_exceeded", apiErr.Code)

	require.NoError(t, wait())
	snap, err := r.status.Flush(testenv.Context(t))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), snap.Classes["interactive"].Counters.Rejected[scheduler.ReasonDueTimePassed])
}

func TestAClientCancellingWhileQueuedFreesItsPlaceAndItsBooking(t *testing.T) {
	c, r := busyCluster(t)
	wait := occupy(t, r)
	ctx := testenv.Context(t)

	qctx, cancel := context.WithCancel(ctx)
	queued := make(chan error, 1)
	cl := r.client()
	go func() {
		_, err := cl.Completions.New(qctx, openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(testModel),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("waiting in line")},
			MaxTokens: openai.Int(4),
		})
		queued <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() bool {
		s, err := r.status.Flush(ctx)
		return err == nil && s.Classes["interactive"].QueueDepth == 1
	}, "the second request queues behind the first")
	cancel()
	require.ErrorIs(t, <-queued, context.Canceled)
	testenv.Eventually(t, 10*time.Second, func() bool {
		s, err := r.status.Flush(ctx)
		return err == nil && s.Classes["interactive"].Counters.Cancelled == 1 && s.Classes["interactive"].QueueDepth == 0
	}, "the queued request is removed and counted cancelled")

	require.NoError(t, wait())
	testenv.Eventually(t, 10*time.Second, func() bool {
		s, err := r.status.Flush(ctx)
		return err == nil && s.Bookings == 0
	}, "no booking is left behind")
	assert.Equal(t, float64(1), c.workers[0].metric(t, "switchyard_worker_http_requests_total"), "the cancelled request never reached the worker")
}

func TestAWorkerKilledMidRunLetsRequestsNotYetStreamingCompleteElsewhere(t *testing.T) {
	c := routerTestCluster(t)
	// w1 is reached through a proxy so the test can kill its network at
	// once; its registration stays (the lease is alive), like a host that
	// died a moment ago.
	port := testenv.FreePort(t)
	proxy := testenv.StartProxy(t, "127.0.0.1:"+strconv.Itoa(port))
	c.addWorker("w1", func(cfg *WorkerConfig) {
		cfg.Listen = "127.0.0.1:" + strconv.Itoa(port)
		cfg.AdvertiseURL = "http://" + proxy.Addr()
		cfg.Engine.Speedup = 10
	})
	c.addWorker("w2", nil)
	r := c.startOwner(2)
	cl := r.client()
	ctx := testenv.Context(t)
	prefix := workerLongPrompt("failover")

	// Warm w1's cache so the router prefers it for this prefix, and start a
	// stream on it that is mid-flight when w1 dies.
	_, err := cl.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prefix + " warm")},
		MaxTokens: openai.Int(2),
	}, option.WithHeader("x-switchyard-worker", "w1"))
	require.NoError(t, err)
	inflight := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prefix + " long answer")},
		MaxTokens: openai.Int(2000),
	}, option.WithHeader("x-switchyard-worker", "w1"))
	require.True(t, inflight.Next(), "the in-flight stream started: %v", inflight.Err())

	proxy.Cut()
	for inflight.Next() {
	}
	require.Error(t, inflight.Err(), "a stream cut after its first token ends with an error")

	// Requests not yet streaming: the index sends them to w1 first; they
	// fail before the first byte and are re-admitted to w2.
	var wg sync.WaitGroup
	routed := make([]string, 6)
	errs := make([]error, 6)
	for i := range routed {
		wg.Go(func() {
			var hr *http.Response
			stream := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel(testModel),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("%s question %d", prefix, i))},
				MaxTokens: openai.Int(8),
			}, option.WithResponseInto(&hr))
			n := 0
			for stream.Next() {
				n++
			}
			errs[i] = stream.Err()
			if hr != nil {
				routed[i] = hr.Header.Get("X-Switchyard-Routed-Worker")
			}
			if errs[i] == nil && n == 0 {
				errs[i] = errors.New("empty stream")
			}
		})
	}
	wg.Wait()
	for i := range routed {
		require.NoError(t, errs[i], "request %d", i)
		assert.Equal(t, "w2", routed[i], "request %d completed on the live worker", i)
	}
	snap, err := r.status.Flush(ctx)
	require.NoError(t, err)
	assert.Positive(t, snap.Classes["interactive"].Counters.Retried, "failed first attempts were re-admitted as retries")
	testenv.Eventually(t, 10*time.Second, func() bool {
		s, err := r.status.Flush(ctx)
		return err == nil && s.Bookings == 0
	}, "the failed attempts' bookings were freed")
}
