package scheduler

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/internal/clock"
)

type runningActor struct {
	*Actor
	clock *clock.Fake
	stop  context.CancelFunc
	err   chan error
}

// startActor runs an actor over a fresh Core until the test ends.
func startActor(t *testing.T, ws []Worker, classes ...ClassConfig) *runningActor {
	t.Helper()
	clock := clock.NewFake(t0)
	core := NewCore(DefaultConfig(), clock, nil, rand.New(rand.NewPCG(3, 4)))
	core.SetWorkers(ws)
	core.SetClasses(classes)
	a := NewActor(core, clock, zaptest.NewLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	ra := &runningActor{Actor: a, clock: clock, stop: cancel, err: make(chan error, 1)}
	go func() { ra.err <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-ra.err)
	})
	return ra
}

func (a *runningActor) snapshot(t *testing.T) *Snapshot {
	t.Helper()
	s, err := a.Flush(context.Background())
	require.NoError(t, err)
	return s
}

type admitted struct {
	grant Grant
	err   error
}

func (a *runningActor) admitAsync(ctx context.Context, r *Request) <-chan admitted {
	out := make(chan admitted, 1)
	go func() {
		g, err := a.Admit(ctx, r)
		out <- admitted{g, err}
	}()
	return out
}

func (a *runningActor) waitQueued(t *testing.T, cls string, depth int) {
	t.Helper()
	require.Eventually(t, func() bool { return a.snapshot(t).Classes[cls].QueueDepth == depth },
		10*time.Second, time.Millisecond, "class %s must reach queue depth %d", cls, depth)
}

func TestActorAdmitsAndPublishesCounters(t *testing.T) {
	a := startActor(t, workers(2, 0), classCfg("c", PolicyFCFS))
	g, err := a.Admit(context.Background(), req("r", "c", 100))
	require.NoError(t, err)
	require.NotZero(t, g.Booking)

	s := a.snapshot(t)
	require.Equal(t, uint64(1), s.Classes["c"].Counters.Admitted)
	require.Equal(t, 1, s.Bookings)
	require.NotZero(t, s.Instance)

	a.Ack(g.Booking)
	a.FirstToken(g.Booking)
	a.Renew([]BookingID{g.Booking})
	a.Finish(g.Booking)
	require.Zero(t, a.snapshot(t).Bookings)
}

func TestActorCancelsAQueuedAdmitWhenItsContextEnds(t *testing.T) {
	a := startActor(t, workers(1, 1), classCfg("c", PolicyFCFS))
	first, err := a.Admit(context.Background(), req("first", "c", 10))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	res := a.admitAsync(ctx, req("second", "c", 10))
	a.waitQueued(t, "c", 1)
	cancel()
	out := <-res
	require.ErrorIs(t, out.err, ErrCancelled)
	require.ErrorIs(t, out.err, context.Canceled)

	s := a.snapshot(t)
	require.Equal(t, 0, s.Classes["c"].QueueDepth)
	require.Equal(t, uint64(1), s.Classes["c"].Counters.Cancelled)

	a.Finish(first.Booking) // the slot frees, and nobody is waiting for it any more
	require.Zero(t, a.snapshot(t).Bookings)
}

func TestActorExpiresAQueuedRequestWhenItsTimerFires(t *testing.T) {
	a := startActor(t, workers(1, 1), classCfg("c", PolicyFCFS))
	_, err := a.Admit(context.Background(), req("first", "c", 10))
	require.NoError(t, err)
	r := req("due", "c", 10)
	r.Due = t0.Add(5 * time.Second)
	res := a.admitAsync(context.Background(), r)
	a.waitQueued(t, "c", 1)

	a.clock.Advance(5 * time.Second)
	out := <-res
	require.ErrorIs(t, out.err, ErrDeadlineExceeded)
	require.Equal(t, uint64(1), a.snapshot(t).Classes["c"].Counters.Rejected[ReasonDueTimePassed])
}

func TestActorRollsBackAnUnacknowledgedGrantAfterTheAckTimeout(t *testing.T) {
	a := startActor(t, workers(1, 1), classCfg("c", PolicyFCFS))
	_, err := a.Admit(context.Background(), req("unacked", "c", 10))
	require.NoError(t, err)
	res := a.admitAsync(context.Background(), req("next", "c", 10))
	a.waitQueued(t, "c", 1)

	a.clock.Advance(DefaultConfig().AckTimeout)
	out := <-res
	require.NoError(t, out.err, "the expired grant's slot goes to the queue")
}

func TestActorStoppingRejectsQueuedRequestsAndLaterArrivalsWithOwnershipLost(t *testing.T) {
	a := startActor(t, workers(1, 1), classCfg("c", PolicyFCFS))
	_, err := a.Admit(context.Background(), req("first", "c", 10))
	require.NoError(t, err)
	res := a.admitAsync(context.Background(), req("queued", "c", 10))
	a.waitQueued(t, "c", 1)

	a.stop()
	require.ErrorIs(t, (<-res).err, ErrOwnershipMoved)
	<-a.Done()

	_, err = a.Admit(context.Background(), req("late", "c", 10))
	require.ErrorIs(t, err, ErrOwnershipMoved)
	got := make(chan error, 1)
	a.Enqueue(req("remote", "c", 10), func(_ Grant, err error) bool { got <- err; return true })
	require.ErrorIs(t, <-got, ErrOwnershipMoved)
	require.Equal(t, uint64(1), a.Snapshot().Classes["c"].Counters.Rejected[ReasonOwnershipLost])
}

func TestActorRunsOnlyOnce(t *testing.T) {
	a := startActor(t, workers(1, 0), classCfg("c", PolicyFCFS))
	a.snapshot(t) // served by the first Run
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.ErrorIs(t, a.Run(ctx), ErrAlreadyRunning)
}

func TestActorEnqueueCompletesThroughTheResponderOnTheActor(t *testing.T) {
	a := startActor(t, workers(1, 0), classCfg("c", PolicyFCFS))
	got := make(chan Grant, 1)
	a.Enqueue(req("remote", "c", 10), func(g Grant, err error) bool {
		require.NoError(t, err)
		got <- g
		return true
	})
	g := <-got
	require.Equal(t, "w0", g.Worker)

	id, err := a.Adopt(context.Background(), BookingRecord{RequestID: "moved", Class: "c", Worker: "w0", PromptTokens: 32})
	require.NoError(t, err)
	require.NotEqual(t, g.Booking, id)
	a.SetWorkers(workers(2, 0))
	a.SetClasses([]ClassConfig{classCfg("c", PolicyLCFS), classCfg("d", PolicyFCFS)})
	a.RemoveClass("d", ReasonOwnershipLost)
	a.Drain()
	s := a.snapshot(t)
	require.Equal(t, 2, s.Bookings)
	require.Len(t, s.Workers, 2)
}

func TestActorSettlesRacingCancellationsExactlyOnce(t *testing.T) {
	a := startActor(t, workers(2, 2), classCfg("c", PolicyFCFS))
	const n = 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				for range i % 7 {
					runtime.Gosched()
				}
				cancel()
			}()
			g, err := a.Admit(ctx, req(fmt.Sprintf("r%d", i), "c", 10))
			if err != nil {
				require.ErrorIs(t, err, ErrCancelled)
				return
			}
			mu.Lock()
			granted++
			mu.Unlock()
			a.Finish(g.Booking)
		}()
	}
	wg.Wait()

	s := a.snapshot(t)
	c := s.Classes["c"].Counters
	// A context that ended before the actor took the request never reached
	// the core and is not counted; everything the core received settled once.
	require.LessOrEqual(t, c.Received, uint64(n))
	require.Equal(t, c.Received, c.Admitted+c.Cancelled, "every received request is admitted or cancelled, once")
	require.GreaterOrEqual(t, c.Admitted, uint64(granted), "grants that raced with cancellation stay counted admitted")
	require.Zero(t, s.Classes["c"].QueueDepth)
	require.Zero(t, s.Bookings, "every booking was finished or rolled back")
}
