package gossip

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// gossipLoadView is the app's adapter: gossip's remote load as the
// scheduler's LoadView.
type gossipLoadView struct{ g *Gossip }

func (v gossipLoadView) RemoteLoad(w string) scheduler.WorkerLoad {
	l := v.g.RemoteLoad(w)
	return scheduler.WorkerLoad{ActiveRequests: l.ActiveRequests, PrefillTokens: l.PrefillTokens, DecodeBlocks: l.DecodeBlocks}
}

// noLoadView is a replica without gossip: it sees only its own ledger.
type noLoadView struct{}

func (noLoadView) RemoteLoad(string) scheduler.WorkerLoad { return scheduler.WorkerLoad{} }

var spreadWorkers = []scheduler.Worker{
	{ID: "w0", URL: "http://w0", BlockSize: 16},
	{ID: "w1", URL: "http://w1", BlockSize: 16},
	{ID: "w2", URL: "http://w2", BlockSize: 16},
	{ID: "w3", URL: "http://w3", BlockSize: 16},
}

func startActor(t *testing.T, lv scheduler.LoadView, seed uint64) *scheduler.Actor {
	t.Helper()
	core := scheduler.NewCore(scheduler.DefaultConfig(), nil, lv, rand.New(rand.NewPCG(seed, seed)))
	a := scheduler.NewActor(core, nil, zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	a.SetWorkers(spreadWorkers)
	a.SetClasses([]scheduler.ClassConfig{{
		Name: "default", Quantum: 1 << 20, Policy: scheduler.PolicyFCFS,
		Limits: scheduler.Limits{Requests: scheduler.Unlimited, ISLTokens: scheduler.Unlimited, CachedTokens: scheduler.Unlimited},
	}})
	return a
}

// burst admits n requests of one shape: a 4-block prompt whose prefix is
// cached 3 deep on w0, 2 on w1, 1 on w2 and not on w3, so every replica that
// sees only its own ledger ranks the idle workers the same way. It returns
// the chosen workers.
func burst(t *testing.T, a *scheduler.Actor, replica string, n int) []string {
	t.Helper()
	var got []string
	for i := range n {
		id := fmt.Sprintf("%s-%d", replica, i)
		r := &scheduler.Request{
			ID: id, Class: "default", Ingress: time.Now(), PromptTokens: 64,
			BlockHashes: []uint64{uint64(len(id)), uint64(i) + 100, uint64(i) + 200, uint64(i) + 300},
			Overlaps:    []scheduler.Overlap{{Worker: "w0", Blocks: 2}, {Worker: "w1", Blocks: 1}},
		}
		g, err := a.Admit(testenv.Context(t), r)
		require.NoError(t, err)
		a.Ack(g.Booking) // keep the booking past the ack timeout
		got = append(got, g.Worker)
	}
	return got
}

// publishLedger is the app's wiring: the actor's ledger becomes this
// replica's gossiped load.
func publishLedger(t *testing.T, a *scheduler.Actor, g *Gossip) {
	t.Helper()
	snap, err := a.Flush(testenv.Context(t))
	require.NoError(t, err)
	loads := make(map[string]WorkerLoad, len(snap.Workers))
	for w, l := range snap.Workers {
		loads[w] = WorkerLoad{ActiveRequests: l.ActiveRequests, PrefillTokens: l.PrefillTokens, DecodeBlocks: l.DecodeBlocks}
	}
	g.SetLocalLoads(loads)
}

func perWorker(ws []string) map[string]int {
	out := map[string]int{}
	for _, w := range ws {
		out[w]++
	}
	return out
}

func TestSchedulersOnTwoReplicasSpreadBurstsOverWorkersThroughGossip(t *testing.T) {
	rs := startCluster(t, 2, nil)

	// Without gossip, the second replica's burst stacks on the workers the
	// first replica's burst already took.
	alone0, alone1 := startActor(t, noLoadView{}, 1), startActor(t, noLoadView{}, 2)
	stacked := append(burst(t, alone0, "a0", 2), burst(t, alone1, "a1", 2)...)
	require.Equal(t, map[string]int{"w0": 2, "w1": 2}, perWorker(stacked), "independent replicas stack on the same two workers")

	// With gossip, the first replica's bookings reach the second before its
	// burst, and the four requests land on four workers.
	s0, s1 := startActor(t, gossipLoadView{rs[0].Gossip}, 1), startActor(t, gossipLoadView{rs[1].Gossip}, 2)
	first := burst(t, s0, "g0", 2)
	publishLedger(t, s0, rs[0].Gossip)
	testenv.Eventually(t, 20*time.Second, func() bool {
		return rs[1].RemoteLoad(first[0]).ActiveRequests == 1 && rs[1].RemoteLoad(first[1]).ActiveRequests == 1
	}, "replica 1 sees replica 0's bookings")
	spread := append(first, burst(t, s1, "g1", 2)...)
	require.Equal(t, map[string]int{"w0": 1, "w1": 1, "w2": 1, "w3": 1}, perWorker(spread), "gossiped load spreads the bursts")
}
