package admission

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// pdWorkers is one prefill and one decode worker (a model that always
// disaggregates).
func pdWorkers(maxRunning int) []scheduler.Worker {
	return []scheduler.Worker{
		{ID: "p0", URL: "http://127.0.0.1:1", BlockSize: 16, KVBlocks: 4096, MaxRunning: maxRunning, Role: scheduler.RolePrefill},
		{ID: "d0", URL: "http://127.0.0.1:2", BlockSize: 16, KVBlocks: 4096, MaxRunning: maxRunning, Role: scheduler.RoleDecode},
	}
}

// pairedGold is class gold disaggregating every request (a threshold of
// one uncached token): request's prompts are short, and a short prompt in
// a fleet without workers of role both runs aggregated otherwise.
func pairedGold() scheduler.ClassConfig {
	c := fcfs("gold")
	c.DisaggMinTokens = 1
	return c
}

func TestAPairGrantCrossesNATSAndIsFreedAsOne(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{pairedGold()}, pdWorkers(0))
	a, b := h.start("a", nil), h.start("b", nil)
	h.own("gold", "a", 7)

	tk, err := b.client.Admit(testenv.Context(t), request("gold", 0))
	require.NoError(t, err)
	g := tk.Grant()
	require.Equal(t, "p0", g.Worker)
	require.Equal(t, "d0", g.Decode.Worker)
	require.Equal(t, "http://127.0.0.1:2", g.Decode.URL)
	require.NotZero(t, g.Decode.Booking)
	require.Equal(t, scheduler.DecisionOnlyPairs, g.Decision)
	tk.Dispatched()
	tk.FirstToken()
	require.Equal(t, 2, a.snapshot(t).Bookings, "the owner books both workers")
	require.Equal(t, 1, a.snapshot(t).Workers["d0"].ActiveRequests)
	tk.Finish(false)
	testenv.Eventually(t, 5*time.Second, func() bool { return a.snapshot(t).Bookings == 0 }, "both bookings freed at the owner")
	c := a.counters(t, "gold")
	require.Equal(t, uint64(1), c.Admitted, "the pair is one admission")
}

func TestAPairIsRehomedAsOneWhenTheClassMoves(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{pairedGold()}, pdWorkers(0))
	a, b, c := h.start("a", nil), h.start("b", nil), h.start("c", nil)
	h.own("gold", "a", 1)
	tk, err := b.client.Admit(testenv.Context(t), request("gold", 0))
	require.NoError(t, err)
	tk.Dispatched()
	require.Equal(t, 2, a.snapshot(t).Bookings)

	h.own("gold", "c", 2)
	testenv.Eventually(t, 5*time.Second, func() bool {
		s := c.snapshot(t)
		return s.Bookings == 2 && s.Workers["d0"].ActiveRequests == 1 && a.snapshot(t).Bookings == 0
	}, "both bookings move from a to c")
	tk.Finish(false)
	testenv.Eventually(t, 5*time.Second, func() bool { return c.snapshot(t).Bookings == 0 }, "both freed at the new owner")
}

func TestAPairHoldsOneSlotOfTheClassQueueAndBothWorkerCaps(t *testing.T) {
	cls := pairedGold()
	cls.Limits.Requests = 1 // per worker: the pair's model has two
	h := newHarness(t, []scheduler.ClassConfig{cls}, pdWorkers(1))
	a, b := h.start("a", nil), h.start("b", nil)
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)
	first, err := b.client.Admit(ctx, request("gold", 0))
	require.NoError(t, err)
	first.Dispatched()
	// The decode worker's cap is reached by the pair: the next waits, and
	// the queue holds two (one slot per worker), not more.
	pending := admitMany(ctx, b.client, 2)
	waitQueued(t, a, "gold", 2)
	over := admitAsync(ctx, b.client, request("gold", 0))
	require.ErrorIs(t, (<-over).err, scheduler.ErrQueueFull)
	first.Finish(false)
	require.Equal(t, 2, finishAll(t, pending))
}
