package metrics

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestExportedTotalsAreExactAndMonotonicUnderRandomDelivery generates, per
// seed, a history of scheduler instances (several per class: replacements),
// each publishing cumulative snapshots in which classes also move away. Every
// snapshot is then delivered at least once, with duplicates, in a random
// order split over several goroutines; afterwards some instances are retired
// while late duplicates of them still arrive. An observer gathers the registry
// throughout. Whatever the interleaving:
//   - no exported series ever decreases between two gathers;
//   - at the end every series equals the true count (the sum over instances
//     of each class's last cumulative counts).
//
// The seed fixes the history and the delivery multiset; the goroutine
// interleaving is left to the scheduler, which is the point.
func TestExportedTotalsAreExactAndMonotonicUnderRandomDelivery(t *testing.T) {
	for seed := uint64(1); seed <= 100; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runRandomDelivery(t, seed) })
	}
}

var randomClasses = []string{"interactive", "batch", "bulk", "premium"}

// history is what the schedulers really counted.
type history struct {
	snaps []AdmissionSnapshot
	// truth maps "series name|worker type|class[|reason]" to its count.
	truth     map[string]float64
	instances []uint64
}

func seriesKey(name, wt, class string, reason ...string) string {
	return strings.Join(append([]string{name, wt, class}, reason...), "|")
}

func generateHistory(rng *rand.Rand) history {
	h := history{truth: map[string]float64{}}
	workerTypes := []string{"prefill", "decode"}
	nInst := 2 + rng.IntN(6)
	for range nInst {
		id := rng.Uint64()
		h.instances = append(h.instances, id)
		wt := workerTypes[rng.IntN(len(workerTypes))]
		owned := map[string]bool{}
		for _, c := range randomClasses {
			if rng.IntN(2) == 0 {
				owned[c] = true
			}
		}
		counts := map[string]*AdmissionCounts{}
		last := map[string]AdmissionCounts{}
		seq := uint64(0)
		for range 1 + rng.IntN(12) {
			seq += 1 + uint64(rng.IntN(3))
			s := AdmissionSnapshot{Instance: id, Seq: seq, WorkerType: wt, Classes: map[string]AdmissionCounts{}}
			for _, class := range randomClasses {
				if !owned[class] {
					continue
				}
				c := counts[class]
				if c == nil {
					c = &AdmissionCounts{}
					counts[class] = c
				}
				c.Received += uint64(rng.IntN(5))
				c.Retried += uint64(rng.IntN(2))
				c.Admitted += uint64(rng.IntN(4))
				c.Cancelled += uint64(rng.IntN(2))
				rej := map[string]uint64{}
				for k, v := range c.Rejected {
					rej[k] = v
				}
				reason := []string{ReasonDueTimePassed, ReasonQueueFull, ReasonNoEndpoints, "surprise"}[rng.IntN(4)]
				rej[reason] += uint64(rng.IntN(3))
				c.Rejected = rej
				s.Classes[class] = *c
				last[class] = *c
				// The class moves away: later snapshots of this instance
				// no longer list it.
				if rng.IntN(8) == 0 {
					delete(owned, class)
				}
			}
			h.snaps = append(h.snaps, s)
		}
		for class, c := range last {
			h.truth[seriesKey(NameAdmissionReceived, wt, class)] += float64(c.Received)
			h.truth[seriesKey(NameAdmissionRetried, wt, class)] += float64(c.Retried)
			h.truth[seriesKey(NameAdmissionAdmitted, wt, class)] += float64(c.Admitted)
			h.truth[seriesKey(NameAdmissionCancelled, wt, class)] += float64(c.Cancelled)
			for reason, v := range c.Rejected {
				h.truth[seriesKey(NameAdmissionRejected, wt, class, Reason(reason))] += float64(v)
			}
		}
	}
	return h
}

// gatherAdmission returns every admission counter series by seriesKey.
func gatherAdmission(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Errorf("gather: %v", err)
		return nil
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "switchyard_router_admission_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			var k string
			if r, ok := l[LabelReason]; ok {
				k = seriesKey(mf.GetName(), l[LabelWorkerType], l[LabelClass], r)
			} else {
				k = seriesKey(mf.GetName(), l[LabelWorkerType], l[LabelClass])
			}
			out[k] = m.GetCounter().GetValue()
		}
	}
	return out
}

func runRandomDelivery(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	hist := generateHistory(rng)
	h := newHarness(t)

	// Delivery plan: each snapshot once, plus duplicates, shuffled, dealt to
	// workers round-robin.
	const workers = 4
	plan := append([]AdmissionSnapshot(nil), hist.snaps...)
	for _, s := range hist.snaps {
		for rng.IntN(3) == 0 {
			plan = append(plan, s)
		}
	}
	rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	lanes := make([][]AdmissionSnapshot, workers)
	for i, s := range plan {
		lanes[i%workers] = append(lanes[i%workers], s)
	}

	// The observer checks monotonicity at every gather until told to stop.
	var stop atomic.Bool
	observerDone := make(chan int)
	go func() {
		prev := map[string]float64{}
		gathers := 0
		for {
			last := stop.Load()
			cur := gatherAdmission(t, h.reg)
			gathers++
			for k, v := range cur {
				if v < prev[k] {
					t.Errorf("seed %d: %s decreased from %v to %v", seed, k, prev[k], v)
				}
			}
			prev = cur
			if last {
				observerDone <- gathers
				return
			}
		}
	}()

	var wg sync.WaitGroup
	for _, lane := range lanes {
		wg.Go(func() {
			for _, s := range lane {
				h.exp.Observe(s)
			}
		})
	}
	wg.Wait()

	// Retire about half the instances (every snapshot has been observed), while
	// late duplicates of all instances keep arriving concurrently.
	var retired []uint64
	for _, id := range hist.instances {
		if rng.IntN(2) == 0 {
			retired = append(retired, id)
		}
	}
	late := make([]AdmissionSnapshot, 0, len(hist.snaps))
	for _, s := range hist.snaps {
		if rng.IntN(2) == 0 {
			late = append(late, s)
		}
	}
	wg.Go(func() {
		for _, id := range retired {
			h.exp.Retire(id)
		}
	})
	wg.Go(func() {
		for _, s := range late {
			h.exp.Observe(s)
		}
	})
	wg.Wait()
	// After retirement, late copies of retired instances must be ignored.
	for _, s := range hist.snaps {
		h.exp.Observe(s)
	}
	stop.Store(true)
	require.Positive(t, <-observerDone)

	got := gatherAdmission(t, h.reg)
	var keys []string
	for k := range hist.truth {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		require.Equal(t, hist.truth[k], got[k], "seed %d: series %s", seed, k)
	}
	for k, v := range got {
		if v != 0 {
			_, ok := hist.truth[k]
			require.True(t, ok, "seed %d: unexpected non-zero series %s = %v", seed, k, v)
		}
	}
	require.Len(t, h.exp.instances, len(hist.instances)-len(retired), "seed %d: retired marks are released", seed)
}
