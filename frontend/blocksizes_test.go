package frontend

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tokenizer"
	"github.com/switchyard/switchyard/wire"
)

// realPrefixIndex is the KV index behind the frontend's port, as the
// replica wires it (exact entries and predictions).
type realPrefixIndex struct{ ix *kvindex.Index }

func (p realPrefixIndex) Overlaps(dst []scheduler.Overlap, seq []uint64) []scheduler.Overlap {
	for _, m := range p.ix.Lookup(seq, nil) {
		dst = append(dst, scheduler.Overlap{Worker: m.Worker, Blocks: m.Blocks})
	}
	return dst
}

func (p realPrefixIndex) Predict(worker string, seq []uint64) {
	_ = p.ix.Predict(worker, seq, 0)
}

// recordingAdmitter passes requests to a real admitter and keeps them.
type recordingAdmitter struct {
	next Admitter
	mu   sync.Mutex
	reqs []scheduler.Request
}

func (a *recordingAdmitter) Admit(ctx context.Context, r *scheduler.Request) (Ticket, error) {
	a.mu.Lock()
	a.reqs = append(a.reqs, *r)
	a.mu.Unlock()
	return a.next.Admit(ctx, r)
}

func (a *recordingAdmitter) last() scheduler.Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reqs[len(a.reqs)-1]
}

func TestWorkersOfOneModelWithDifferentBlockSizesBothGetPrefixHits(t *testing.T) {
	ix, err := kvindex.New(kvindex.DefaultConfig(), clock.Real{}, nil, nil)
	require.NoError(t, err)
	page1, page16 := newUpstream(t, 2), newUpstream(t, 2)
	// w1 pages its KV cache one token at a time (SGLang's page size 1),
	// w2 sixteen (vLLM's default); the first listed is the smallest, as
	// the old code's choice would have been.
	entries := staticWorkers{
		{ID: "w1", URL: page1.URL(), Model: "m", BlockSize: 1},
		{ID: "w2", URL: page16.URL(), Model: "m", BlockSize: 16},
	}
	pol := DefaultPolicy()
	actor := startActor(t, pol, []scheduler.Worker{
		{ID: "w1", URL: page1.URL(), BlockSize: 1, KVBlocks: 1 << 16},
		{ID: "w2", URL: page16.URL(), BlockSize: 16, KVBlocks: 1 << 12},
	})
	rec := &recordingAdmitter{next: NewLocalAdmitter(actor)}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: rec, Workers: entries, Index: realPrefixIndex{ix}, Policy: pol})
	base := startServer(t, s)

	words := func(tag string) string {
		var b strings.Builder
		for i := range 40 {
			fmt.Fprintf(&b, "%s%d ", tag, i)
		}
		return b.String()
	}
	seed := kvindex.ModelSeed("m")
	held := map[string]string{"w1": words("alpha"), "w2": words("beta")}
	for id, bs := range map[string]int{"w1": 1, "w2": 16} {
		// What each engine's events put in the index: the prompt's blocks
		// at the engine's own block size.
		_, err := ix.ApplyBatch(&wire.KVEventBatch{Worker: id, Instance: 1, FirstID: 1, Events: []wire.KVEvent{
			{Kind: wire.KVStored, Hashes: kvindex.SequenceHashes(tokenizer.Encode(held[id]), bs, seed)},
		}})
		require.NoError(t, err)
	}
	// w2 last: the final checks read the last request's hashes.
	for _, w := range []struct {
		id string
		bs int
	}{{"w1", 1}, {"w2", 16}} {
		id, bs := w.id, w.bs
		n := len(tokenizer.Encode(held[id]))
		require.GreaterOrEqual(t, n, 32, "at least two blocks of 16")
		status, h, body := post(t, base+"/v1/completions", `{"model":"m","max_tokens":2,"prompt":"`+held[id]+`"}`, nil)
		require.Equal(t, http.StatusOK, status, body)
		assert.Equal(t, id, h.Get(HeaderRoutedWorker), "the prompt goes where its prefix is cached")
		r := rec.last()
		assert.Equal(t, n, len(r.BlockHashes), "hashed at the smallest size, one hash per token")
		assert.Equal(t, n/bs, r.OverlapBlocks(id), "%s's hit counted in its own %d-token blocks", id, bs)
		assert.Equal(t, (n/bs)*bs, r.CachedTokens(id, bs))
	}
	r := rec.last()
	require.Len(t, r.SizedHashes, 1)
	assert.Equal(t, 16, r.SizedHashes[0].BlockSize)
	assert.Equal(t, kvindex.SequenceHashes(tokenizer.Encode(held["w2"]), 16, seed), r.HashesFor(16))
}

func TestAModelServedAtOneBlockSizeIsHashedOnce(t *testing.T) {
	var rt routing
	sized := false
	for _, bs := range []int{16, 0, 16} {
		sized = rt.noteBlockSize(bs, sized)
	}
	assert.Equal(t, 16, rt.blockSize)
	assert.Empty(t, rt.otherSizes)
	assert.Nil(t, rt.sizedHashes(prompt.Result{IDs: tokenizer.IDs{Head: []uint32{1, 2, 3}}}, 1))
	for _, bs := range []int{32, 1, 16, 32} {
		sized = rt.noteBlockSize(bs, sized)
	}
	assert.Equal(t, 1, rt.blockSize, "the smallest size is the request's own")
	assert.ElementsMatch(t, []int{16, 32}, rt.otherSizes)
}

// BenchmarkRouteAndHash is the route path of one request up to admission:
// resolving the model against 8 workers and hashing a 4k-token prompt at
// each distinct block size (one when the fleet agrees, the common case;
// two for SGLang at page size 1 beside vLLM at 16), then the index lookup
// per size.
func BenchmarkRouteAndHash(b *testing.B) {
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(i*7919 + 1)
	}
	ids := prompt.Result{IDs: tokenizer.IDs{Head: tokens}} // not from a cache: hashed in full every time
	for _, c := range []struct {
		name  string
		sizes []int
	}{{"uniform-16", []int{16}}, {"mixed-1-16", []int{1, 16}}} {
		b.Run(c.name, func(b *testing.B) {
			ix, err := kvindex.New(kvindex.DefaultConfig(), clock.Real{}, nil, nil)
			require.NoError(b, err)
			var ws staticWorkers
			for i := range 8 {
				ws = append(ws, WorkerEntry{ID: fmt.Sprintf("w%d", i), URL: "http://127.0.0.1:1", Model: "m", BlockSize: c.sizes[i%len(c.sizes)]})
			}
			s, err := New(DefaultConfig(), Deps{Admitter: &fakeAdmitter{}, Workers: ws, Index: realPrefixIndex{ix}, Prompts: toyPrompts(b, "m")}, zap.NewNop(), prometheus.NewRegistry())
			require.NoError(b, err)
			seed := kvindex.ModelSeed("m")
			b.ReportAllocs()
			for b.Loop() {
				rt, _ := s.route("m")
				req := scheduler.Request{BlockHashes: ids.SequenceHashes(rt.blockSize, seed), SizedHashes: rt.sizedHashes(ids, seed)}
				req.Overlaps = s.overlaps(&req)
			}
		})
	}
}
