package adapter

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/wire"
)

// sampledOf is the part of hs an index sampling at n keeps.
func sampledOf(hs []uint64, n int) []uint64 {
	var out []uint64
	for _, h := range hs {
		if kvindex.Sampled(h, n) {
			out = append(out, h)
		}
	}
	return out
}

func TestASampledMirrorPublishesOnlyTheHashesASampledIndexKeeps(t *testing.T) {
	const sample = 4
	n := testenv.StartNATS(t)
	// What goes over the wire: every batch declares the rate, and every
	// hash in it is one the rate keeps.
	raw, err := n.Conn(t).SubscribeSync(wire.NewSubjects(testCluster).KV("w1"))
	require.NoError(t, err)
	router := startSampledRouterIndex(t, n, "w1", 2048, sample)
	coarse := startSampledRouterIndex(t, n, "w1", 2048, 2*sample)
	fine := startSampledRouterIndex(t, n, "w1", 2048, 1)
	m := startSampledMirror(t, n, "w1", testShape(), prometheus.NewRegistry(), sample)
	f := &feeder{h: m}

	a := newPrompt(1, 40, testBS)
	c := newPrompt(2, 24, testBS)
	f.batch(a.stored(0, 20))
	f.batch(a.stored(20, 40), c.stored(0, 24))
	f.batch(c.removed(8, 24))
	all := append(a.want(testModel, 40), c.want(testModel, 8)...)
	require.NotEmpty(t, sampledOf(all, sample), "the prompts must have sampled blocks for the test to mean anything")

	// The routers hold what an index at their rate would hold had every
	// hash been published: the sampled mirror loses them nothing.
	router.holdsExactly(t, "w1", sampledOf(all, sample), "index at the mirror's rate")
	coarse.holdsExactly(t, "w1", sampledOf(all, 2*sample), "index at twice the mirror's rate")
	assert.Zero(t, testenv.MetricValue(t, router.reg, metrics.NameIndexSampleMismatch, nil))

	// An index finer than the mirror sees only the mirror's hashes, and
	// counts every batch of it as a misconfiguration.
	fine.holdsExactly(t, "w1", sampledOf(all, sample), "index at every hash fed a sampled mirror")
	assert.Positive(t, testenv.MetricValue(t, fine.reg, metrics.NameIndexSampleMismatch, nil))

	var ids uint64
	for ids < 3 {
		msg, err := raw.NextMsg(5 * time.Second)
		require.NoError(t, err)
		b, err := wire.DecodeKVEventBatch(msg.Data)
		require.NoError(t, err)
		if len(b.Events) == 0 {
			continue // a heartbeat
		}
		require.Equal(t, sample, b.Sample)
		for _, e := range b.Events {
			for _, h := range e.Hashes {
				require.True(t, kvindex.Sampled(h, sample), "published hash %x is not sampled at %d", h, sample)
			}
		}
		ids++
	}
}

func TestTheMirrorRejectsASampleOutsideTheIndexsRange(t *testing.T) {
	cfg := DefaultMirrorConfig()
	cfg.Worker = "w1"
	for _, s := range []int{-1, kvindex.MaxSample + 1} {
		cfg.Sample = s
		require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "sample %d", s)
	}
	c := DefaultConfig()
	c.KVSample = kvindex.MaxSample + 1
	require.ErrorContains(t, c.Validate(), "kv-sample")
}

// A dump of a sampled mirror is its sampled view, as its batches are: a
// router finer than the mirror that asks for one (it missed a batch) would
// otherwise hold hashes whose removals the batches never carry.
func TestASampledMirrorsDumpHoldsOnlyTheHashesItsBatchesCarry(t *testing.T) {
	const sample = 4
	n := testenv.StartNATS(t)
	router := startSampledRouterIndex(t, n, "w1", 2048, sample)
	m := startSampledMirror(t, n, "w1", testShape(), prometheus.NewRegistry(), sample)
	f := &feeder{h: m}
	a := newPrompt(1, 40, testBS)
	f.batch(a.stored(0, 40))
	want := sampledOf(a.want(testModel, 40), sample)
	require.NotEmpty(t, want, "the prompt must have sampled blocks for the test to mean anything")
	router.holdsExactly(t, "w1", want, "index at the mirror's rate")

	nc := n.Conn(t)
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	require.NoError(t, err)
	require.NoError(t, nc.PublishRequest(wire.NewSubjects(testCluster).KVDump("w1"), inbox, wire.EncodeKVDumpRequest(&wire.KVDumpRequest{})))
	var got []uint64
	for {
		msg, err := sub.NextMsg(5 * time.Second)
		require.NoError(t, err, "the dump's chunks")
		c, err := wire.DecodeKVDumpChunk(msg.Data)
		require.NoError(t, err)
		got = append(got, c.Hashes...)
		if c.Final {
			break
		}
	}
	require.ElementsMatch(t, want, got)
}
