// Package kvtest builds the KV cache events and hash chains that the tests
// of the index (kvindex) and of its NATS ingest (kvingest) feed them. Only
// test code imports it.
package kvtest

import (
	"slices"

	"github.com/switchyard/switchyard/wire"
)

// Chain returns n distinct pseudo-random hashes derived from seed.
func Chain(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		z := seed<<24 ^ uint64(i) // distinct inputs for seeds below 2^40 and chains below 2^24
		z += 0x9E3779B97F4A7C15
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		out[i] = z ^ (z >> 31)
	}
	return out
}

// Ptr returns a pointer to h (a parent hash for Stored).
func Ptr(h uint64) *uint64 { return &h }

// Stored is a stored event of hs, chained to parent when it is not nil.
func Stored(parent *uint64, hs ...uint64) wire.KVEvent {
	e := wire.KVEvent{Kind: wire.KVStored, Hashes: hs}
	if parent != nil {
		e.Parent, e.HasParent = *parent, true
	}
	return e
}

// Removed is a removal event of hs.
func Removed(hs ...uint64) wire.KVEvent { return wire.KVEvent{Kind: wire.KVRemoved, Hashes: hs} }

// Batch is worker's batch of events, its instance and first event id.
func Batch(worker string, instance, firstID uint64, events ...wire.KVEvent) *wire.KVEventBatch {
	return &wire.KVEventBatch{Worker: worker, Instance: instance, FirstID: firstID, Events: events}
}

// SortedHashes returns a sorted copy of hs.
func SortedHashes(hs []uint64) []uint64 {
	out := slices.Clone(hs)
	slices.Sort(out)
	return out
}
