package app

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

// sendLoad sends n small completions spread over replicas and classes, at
// most 8 at a time, and returns how many succeeded.
func sendLoad(t *testing.T, replicas []*runningReplica, n int) int64 {
	t.Helper()
	var ok atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := 0; i < n; i++ {
		r := replicas[i%len(replicas)]
		class := defaultClasses[i%len(defaultClasses)]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			cl := r.client()
			_, err := cl.Completions.New(context.Background(), openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel(testModel),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("request %d of the load", i))},
				MaxTokens: openai.Int(2),
			}, option.WithHeader("x-switchyard-class", class))
			if err == nil {
				ok.Add(1)
			} else {
				t.Logf("request %d via %s: %v", i, r.status.ID, err)
			}
		}()
	}
	wg.Wait()
	return ok.Load()
}

func TestPrometheusSumOfReceivedEqualsRequestsSentAcrossAHandoff(t *testing.T) {
	addrs := make([]string, 3)
	for i := range addrs {
		addrs[i] = "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	}
	prom := testenv.StartPrometheus(t, addrs, 500*time.Millisecond)
	c := newTestCluster(t, 3)
	r1, r2 := c.startReplicaAt("r1", addrs[0]), c.startReplicaAt("r2", addrs[1])
	c.waitOwned(defaultClasses, "r1", "r2")

	const first, second = 60, 60
	okFirst := sendLoad(t, []*runningReplica{r1, r2}, first)
	require.EqualValues(t, first, okFirst, "every request of the first wave succeeds")

	// A third replica joins: the classes rendezvous hashing places on it are
	// handed over by their owners while traffic continues.
	r3 := c.startReplicaAt("r3", addrs[2])
	c.waitPlaced(defaultClasses, "r1", "r2", "r3")
	okSecond := sendLoad(t, []*runningReplica{r1, r2, r3}, second)
	require.EqualValues(t, second, okSecond, "every request of the second wave succeeds")
	require.NotEmpty(t, r3.status.Owned(), "the new replica took over at least one class")

	ctx := testenv.Context(t)
	var received, admitted float64
	testenv.Eventually(t, 20*time.Second, func() bool {
		var err error
		received, err = prom.Query(ctx, `sum(switchyard_router_admission_received_total)`)
		if err != nil {
			return false
		}
		admitted, err = prom.Query(ctx, `sum(switchyard_router_admission_admitted_total)`)
		return err == nil && received == first+second && admitted == first+second
	}, "Prometheus' cluster-wide sums to equal the requests sent (last: received %v admitted %v)", &received, &admitted)
	require.Equal(t, float64(first+second), received)
	rejected, err := prom.Query(ctx, `sum(switchyard_router_admission_rejected_total)`)
	require.NoError(t, err)
	require.Zero(t, rejected)
}
