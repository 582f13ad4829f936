package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// serveSingleSlot runs a saturated single slot for n grants and returns how
// many each class got.
func (h *harness) serveSingleSlot(running BookingID, n int) map[string]int {
	h.t.Helper()
	served := map[string]int{}
	for _, id := range h.drainOneByOne(running, n) {
		served[h.classOf[id]]++
	}
	return served
}

func (h *harness) enqueueMany(cls string, n, isl int) {
	for i := range n {
		id := fmt.Sprintf("%s-%d", cls, i)
		h.classOf[id] = cls
		h.enqueue(req(id, cls, isl))
	}
}

func TestDRRSharesServiceInProportionToQuanta(t *testing.T) {
	big, small := classCfg("big", PolicyFCFS), classCfg("small", PolicyFCFS)
	big.Quantum, small.Quantum = 512, 128
	h := newHarness(t, workers(1, 1), big, small)
	running := h.occupy("big", 1)[0]
	h.enqueueMany("big", 200, 64)
	h.enqueueMany("small", 200, 64)

	served := h.serveSingleSlot(running, 100)
	require.Equal(t, 80, served["big"], "512:128 quanta with equal costs must serve 4:1")
	require.Equal(t, 20, served["small"])
}

func TestDRRBulkCreditServesHeadsCostlierThanOneQuantumInProportion(t *testing.T) {
	heavy, light := classCfg("heavy", PolicyFCFS), classCfg("light", PolicyFCFS)
	heavy.Quantum, light.Quantum = 10, 10
	h := newHarness(t, workers(1, 1), heavy, light)
	running := h.occupy("light", 1)[0]
	h.enqueueMany("heavy", 20, 1000) // 100 quanta per request
	h.enqueueMany("light", 200, 100) // 10 quanta per request

	served := h.serveSingleSlot(running, 44)
	require.Equal(t, 4, served["heavy"], "equal quanta must give equal token service: 4×1000")
	require.Equal(t, 40, served["light"], "equal quanta must give equal token service: 40×100")
}

func TestDRRClassWithBlockedHeadKeepsItsDeficitButDoesNotGrowIt(t *testing.T) {
	a, b := classCfg("a", PolicyFCFS), classCfg("b", PolicyFCFS)
	h := newHarness(t, workers(2, 1), a, b)
	ids := h.occupy("a", 2) // w0 and w1 busy
	// b's head is pinned to w1 and stays blocked; a is served on w0.
	pinned := req("b-pinned", "b", 300)
	pinned.Pinned = "w1"
	h.classOf["b-pinned"] = "b"
	h.enqueue(pinned)
	h.core.classes["b"].deficit = 100 // credit from an earlier turn
	for i := range 20 {
		r := req(fmt.Sprintf("a-%d", i), "a", 64)
		r.Allowed = []string{"w0"}
		h.enqueue(r)
	}

	running := ids[0]
	for range 10 {
		h.core.Finish(running)
		running = h.granted(h.order[len(h.order)-1]).Booking
	}
	require.Equal(t, int64(100), h.core.classes["b"].deficit, "a blocked class neither loses nor gains credit")
	h.pending("b-pinned")

	h.core.Finish(ids[1]) // w1 frees: b's head becomes dispatchable
	require.Equal(t, "w1", h.granted("b-pinned").Worker)
}

func TestDRRIdleClassDoesNotBankCredit(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("a", PolicyFCFS))
	h.enqueue(req("x", "a", 10))
	h.granted("x")
	require.Zero(t, h.core.classes["a"].deficit, "a class whose queue empties starts from zero")
}

func TestArrivalNeverBypassesTheBacklogOfItsOwnClass(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	h.remote["w0"] = WorkerLoad{ActiveRequests: 1} // another replica holds the only slot
	h.enqueue(req("first", "c", 10))
	h.pending("first")

	delete(h.remote, "w0") // capacity frees silently (gossip), no drain yet
	h.enqueue(req("second", "c", 10))

	h.granted("first")
	h.pending("second")
}

func TestArrivalDrainsAnotherClassesBacklogInsteadOfBypassingIt(t *testing.T) {
	waiting, arriving := classCfg("waiting", PolicyFCFS), classCfg("arriving", PolicyFCFS)
	waiting.Quantum, arriving.Quantum = 100, 1 // waiting affords its head first
	h := newHarness(t, workers(1, 1), arriving, waiting)
	h.remote["w0"] = WorkerLoad{ActiveRequests: 1}
	h.enqueue(req("queued", "waiting", 100))
	h.pending("queued")

	delete(h.remote, "w0")
	h.enqueue(req("new", "arriving", 100))

	h.granted("queued")
	h.pending("new")
}

func TestUncontendedArrivalIsAdmittedInTheSameTurn(t *testing.T) {
	h := newHarness(t, workers(3, 0), classCfg("c", PolicyFCFS))
	h.enqueue(req("r", "c", 100))
	g := h.granted("r")
	require.NotZero(t, g.Booking)
	require.Zero(t, g.QueueWait)
	require.Equal(t, 0, h.core.Queued())
}

// drrRingModel serves one member of a DRR ring in which every member has a
// head: each turn adds the member's quantum, and the first member whose
// deficit covers its head's cost is served (and charged). With skip, a full
// cycle without service runs drrSkipAhead, as popNext and tenantCandidate
// do. It returns the served member and every deficit when it was served.
func drrRingModel(deficit, quantum, cost []int64, skip bool) (int, []int64) {
	d := append([]int64(nil), deficit...)
	for idle, i := 0, 0; ; i = (i + 1) % len(d) {
		d[i] += quantum[i]
		if d[i] >= cost[i] {
			d[i] -= cost[i]
			return i, d
		}
		if idle++; idle == len(d) && skip {
			drrSkipAhead(len(d), func(j int) (*int64, int64, int64, bool) { return &d[j], quantum[j], cost[j], true })
			idle = 0
		}
	}
}

// The bulk credit only skips cycles in which nobody could be served: the
// member served and every deficit are those of the ring that spins through
// each of those cycles.
func TestDRRSkipAheadServesWhomTheSpinningRingServesWithTheSameDeficits(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for n := range 2000 {
		m := 1 + rng.IntN(6)
		deficit, quantum, cost := make([]int64, m), make([]int64, m), make([]int64, m)
		for i := range m {
			quantum[i] = 1 + rng.Int64N(50)
			cost[i] = 1 + rng.Int64N(5000)
			deficit[i] = rng.Int64N(cost[i]) // below its cost: the cycle before was idle
		}
		wantWho, want := drrRingModel(deficit, quantum, cost, false)
		gotWho, got := drrRingModel(deficit, quantum, cost, true)
		require.Equal(t, wantWho, gotWho, "case %d: deficits %v quanta %v costs %v", n, deficit, quantum, cost)
		require.Equal(t, want, got, "case %d: deficits %v quanta %v costs %v", n, deficit, quantum, cost)
	}
	require.False(t, drrSkipAhead(3, func(int) (*int64, int64, int64, bool) { return nil, 0, 0, false }),
		"a ring without heads has nothing to skip to")
}
