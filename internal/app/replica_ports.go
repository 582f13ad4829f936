package app

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/frontend"
	"github.com/switchyard/switchyard/gossip"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// The small adapters by which a replica's components meet each other's
// ports: the frontend's Admitter, Workers and Index, and the tokenizer
// registry's view of what the workers advertise.

// admitter adapts the admission client to the frontend's port, and
// observes how long admission took: the queue wait the owner reports, and
// the rest (the decision, and the hop to a remote owner).
type admitter struct {
	c          *admission.Client
	m          *metrics.Admission
	workerType string
}

func (a admitter) Admit(ctx context.Context, r *scheduler.Request) (frontend.Ticket, error) {
	start := time.Now()
	t, err := a.c.Admit(ctx, r)
	if err != nil {
		return nil, err
	}
	g := t.Grant()
	a.m.QueueWait.WithLabelValues(a.workerType, r.Class).Observe(g.QueueWait.Seconds())
	a.m.Decision.WithLabelValues(a.workerType, r.Class).Observe(max(0, time.Since(start)-g.QueueWait).Seconds())
	return t, nil
}

// workerView adapts the worker registry to the frontend's port.
type workerView struct{ w *cluster.Workers }

func (v workerView) Workers() []frontend.WorkerEntry {
	snap := v.w.Snapshot()
	out := make([]frontend.WorkerEntry, 0, len(snap.Items))
	for _, it := range snap.Items {
		out = append(out, frontend.WorkerEntry{ID: it.Info.ID, URL: it.Info.URL, Model: it.Info.Model, BlockSize: it.Info.BlockSize, Models: it.Info.Models, MaxModelLen: it.Info.MaxModelLen,
			Salt: it.Info.Salt, Cards: it.Info.Cards, PrioritySchedules: it.Info.PrioritySchedules, DPRank: it.Info.DPRank, DPSize: it.Info.DPSize,
			Messages: slices.Contains(it.Info.APIs, wire.APIMessages),
			Role:     it.Info.RoleOf(), KVTransfer: it.Info.KVTransfer, BootstrapPort: it.Info.BootstrapPort})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// prefixIndex adapts the KV index (exact and predicted entries) to the
// frontend's port, and shares predictions with the other replicas.
type prefixIndex struct {
	ix          *kvindex.Index
	g           *gossip.Gossip // nil: predictions stay local
	ttl         time.Duration  // on workers that publish KV events
	ttlNoEvents time.Duration  // on workers that do not
	publishes   func(worker string) bool
}

var matchPool = sync.Pool{New: func() any { s := make([]kvindex.Match, 0, 64); return &s }}

func (p prefixIndex) Overlaps(dst []scheduler.Overlap, seqHashes []uint64) []scheduler.Overlap {
	buf := matchPool.Get().(*[]kvindex.Match)
	ms := p.ix.Lookup(seqHashes, (*buf)[:0])
	for _, m := range ms {
		dst = append(dst, tierOverlap(m))
	}
	*buf = ms
	matchPool.Put(buf)
	return dst
}

// ExactOverlap is the prefix depth worker holds by the engine's own events
// (frontend.ExactIndex): what tells an eviction from a wrong prediction.
func (p prefixIndex) ExactOverlap(worker string, seqHashes []uint64) int {
	return p.ix.HeldDepth(worker, seqHashes)
}

func (p prefixIndex) Predict(worker string, seqHashes []uint64) {
	ttl := p.ttl
	if p.publishes != nil && !p.publishes(worker) {
		ttl = p.ttlNoEvents
	}
	_ = p.ix.Predict(worker, seqHashes, ttl)
	if p.g != nil {
		p.g.Predict(worker, seqHashes, ttl)
	}
}

// advertisedTokenizers collects, per served model name, the tokenizer
// sources the workers' registrations advertise, in worker id order.
func advertisedTokenizers(items map[string]cluster.Worker) map[string][]wire.TokenizerSource {
	ids := make([]string, 0, len(items))
	for id := range items {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := map[string][]wire.TokenizerSource{}
	for _, id := range ids {
		wi := items[id].Info
		if wi.Tokenizer == nil {
			continue
		}
		for _, m := range append([]string{wi.Model}, wi.Models...) {
			out[m] = append(out[m], *wi.Tokenizer)
		}
	}
	return out
}
