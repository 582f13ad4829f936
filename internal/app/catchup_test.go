package app

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/gossip"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// An index that lost a worker's trailing batch learns it from a peer's
// gossiped digest of the same engine instance: noted twice while still
// behind, the worker is reset for a dump. Peers of another instance, or not
// ahead, change nothing.
func TestALaggingIndexCatchesUpWithItsPeersDigests(t *testing.T) {
	ix, err := kvindex.New(kvindex.DefaultConfig(), nil, zap.NewNop(), prometheus.NewRegistry())
	require.NoError(t, err)
	const instance = 7
	stored := func(first uint64, hashes ...uint64) *wire.KVEventBatch {
		b := &wire.KVEventBatch{Worker: "w1", Instance: instance, FirstID: first}
		for i, h := range hashes {
			e := wire.KVEvent{Kind: wire.KVStored, Hashes: []uint64{h}}
			if first+uint64(i) > 1 {
				e.Parent, e.HasParent = hashes[0]+uint64(i)-1, true
			}
			b.Events = append(b.Events, e)
		}
		return b
	}
	out, err := ix.ApplyBatch(stored(1, 100, 101, 102))
	require.NoError(t, err)
	require.Equal(t, kvindex.OutcomeApplied, out)
	d, ok := ix.Digest("w1")
	require.True(t, ok)
	require.Equal(t, uint64(3), d.LastID)

	// Events 4 and 5 reached the peers but were lost here, and the worker
	// went quiet: no later batch reveals the gap.
	peers := map[string]map[string]gossip.Digest{
		"r2": {"w1": {LastEventID: 5, Blocks: 5, Instance: instance}},
		"r3": {"w1": {LastEventID: 4, Blocks: 4, Instance: instance}},
		"r4": {"w1": {LastEventID: 90, Blocks: 9, Instance: instance + 1}}, // another engine start: not comparable
	}
	require.Zero(t, catchUpWithPeers(ix, gossipDigests(ix), peers), "one digest is not proof: the batch may still be on its way")
	require.False(t, ix.NeedsDump("w1"))
	require.Equal(t, 1, catchUpWithPeers(ix, gossipDigests(ix), peers), "noted again while still behind: repair")
	require.True(t, ix.NeedsDump("w1"), "the worker waits for its dump")

	// A replica that is not behind leaves the worker alone.
	ix2, err := kvindex.New(kvindex.DefaultConfig(), nil, zap.NewNop(), prometheus.NewRegistry())
	require.NoError(t, err)
	_, err = ix2.ApplyBatch(stored(1, 100, 101, 102))
	require.NoError(t, err)
	behind := map[string]map[string]gossip.Digest{"r2": {"w1": {LastEventID: 2, Blocks: 2, Instance: instance}}}
	for range 3 {
		require.Zero(t, catchUpWithPeers(ix2, gossipDigests(ix2), behind))
	}
	require.False(t, ix2.NeedsDump("w1"))
}
