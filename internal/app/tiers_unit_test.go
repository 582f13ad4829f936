package app

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

func TestATierStreamStaysIndexedWhileItsWorkerAdvertisesTheTier(t *testing.T) {
	items := map[string]cluster.Worker{
		"v1": {Info: wire.WorkerInfo{ID: "v1", TierBlocks: map[string]int{"cpu": 100}}},
		"v2": {Info: wire.WorkerInfo{ID: "v2"}},
	}
	assert.True(t, streamRegistered(items, "v1"))
	assert.True(t, streamRegistered(items, "v1--cpu"))
	assert.False(t, streamRegistered(items, "v1--disk"), "a tier the worker does not advertise")
	assert.False(t, streamRegistered(items, "v2--cpu"))
	assert.False(t, streamRegistered(items, "v3--cpu"), "a departed worker's tier")
	assert.False(t, streamRegistered(items, "v3"))
}

func TestATierStreamsMatchIsALowerTierOverlapOfItsWorker(t *testing.T) {
	assert.Equal(t, scheduler.Overlap{Worker: "v1", Blocks: 7, Tier: scheduler.TierCPU},
		tierOverlap(kvindex.Match{Worker: "v1--cpu", Blocks: 7}))
	assert.Equal(t, scheduler.Overlap{Worker: "v1", Blocks: 3}, tierOverlap(kvindex.Match{Worker: "v1", Blocks: 3}))
	assert.Equal(t, scheduler.Tier(kvindex.TierDisk), scheduler.TierDisk, "the two packages' tiers agree")
}
