package enginekv

import (
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// transientRecorder is a TransientHandler: it records a deep copy of every
// batch it is lent, the addresses it was lent, and any call of Batch.
type transientRecorder struct {
	recorder
	mu    sync.Mutex
	lent  map[*Batch]bool
	owned int
}

func (r *transientRecorder) BatchTransient(b *Batch) {
	c := *b
	c.Events = slices.Clone(b.Events)
	for i := range c.Events {
		c.Events[i].BlockHashes = slices.Clone(c.Events[i].BlockHashes)
		c.Events[i].TokenIDs = slices.Clone(c.Events[i].TokenIDs)
	}
	r.recorder.Batch(c)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lent[b] = true
}

func (r *transientRecorder) Batch(Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.owned++
}

func TestATransientHandlerIsLentEveryBatchFromOneDecoder(t *testing.T) {
	p, _ := startPublisher(t, pubConfig(LayoutMap, HashBytes, false))
	rec := &transientRecorder{lent: map[*Batch]bool{}}
	runSubscriber(t, subConfig(p.Endpoint(), ""), rec)
	waitSubscribed(t, p)
	for i := range 6 {
		publishScenario(p, i)
	}
	rec.waitBatches(t, 6)
	require.Equal(t, seqTrace(0, 6), rec.trace())
	requireBatchesMatch(t, &rec.recorder, identity)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Zero(t, rec.owned, "Batch called on a TransientHandler")
	require.Len(t, rec.lent, 1, "every batch lent from the same Decoder")
}

func TestADecoderReusedAcrossPayloadsDecodesEachAsDecodeBatchDoes(t *testing.T) {
	var dec Decoder
	for round := range 2 {
		for i := range 6 {
			for _, enc := range allEncodings {
				p := EncodeBatch(Batch{TS: float64(i), DPRank: -1, Events: wantEvents(i)}, enc)
				want, err := DecodeBatch(p)
				require.NoError(t, err)
				got, err := dec.Decode(p)
				require.NoError(t, err)
				require.Equal(t, want, *got, "round %d, scenario %d, %v/%v", round, i, enc.Layout, enc.Hashes)
			}
		}
		// A bad payload in between leaves nothing behind.
		_, err := dec.Decode([]byte{0x93, 0xc0})
		require.ErrorIs(t, err, ErrMalformed)
	}
}
