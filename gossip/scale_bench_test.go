package gossip

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkScaleGossip is the scale report's gossip curve: bytes per second
// per replica (wire_B/s/replica, everything memberlist sends) and how long
// one load change takes to reach every other replica (conv_p50_ms,
// conv_max_ms), at 8, 16 and 32 replicas on loopback, with 1,000 and 10,000
// workers. Each replica changes the booked load of as many workers per
// 50 ms interval as §1's request rate per engine (2.5 requests/s, two load
// changes each) spread over the replicas makes; every replica also
// publishes the index digests of all workers. One iteration is one
// interval: run with -benchtime 40x (2 s). Push-pull runs every second
// (not 10 s) so that a short run holds some: stream_B/s/replica is what the
// replicas wrote to TCP streams (push-pull and its fetches), and
// stream_at_default_B/s/replica that scaled to the default interval. All replicas share the
// benchmark's process and the machine's cores, so on a loaded machine the
// convergence times include waiting for a core.
func BenchmarkScaleGossip(b *testing.B) {
	for _, workers := range []int{1_000, 10_000} {
		for _, n := range []int{8, 16, 32} {
			changes := max(1, workers*5/n/20)
			b.Run(fmt.Sprintf("workers=%d/replicas=%d", workers, n), func(b *testing.B) {
				benchBandwidth(b, n, workers, changes, func(c *Config) { c.PushPullInterval = time.Second })
			})
		}
	}
}

// BenchmarkScaleConvergence measures how long a load change at one replica
// takes to be visible at all others, at 8, 16 and 32 replicas. One
// iteration is one change.
func BenchmarkScaleConvergence(b *testing.B) {
	for _, n := range []int{8, 16, 32} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			rs := startCluster(b, n, nil)
			b.ResetTimer()
			lat := convergence(b, rs)
			b.StopTimer()
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "conv_p50_ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "conv_p99_ms")
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "conv_max_ms")
		})
	}
}

// BenchmarkScalePushPullSize is the push-pull size estimate at 10,000
// workers and 8, 32 and 64 replicas, where the in-process cluster does not
// fit the machine: the encoded full state every replica carried per
// push-pull before codec version 4 (full_state_B), the digest it carries
// now (digest_B), each as bytes per second per replica at the default
// interval (a replica sends about two per interval: the one it starts and
// the one it answers), and the fetch a replica sends for one origin that
// differs (fetch_origin_B, 256 buckets). Fetch answers are not in the
// estimate: they are what differs, measured by BenchmarkScaleGossip.
func BenchmarkScalePushPullSize(b *testing.B) {
	for _, n := range []int{8, 32, 64} {
		b.Run(fmt.Sprintf("workers=10000/replicas=%d", n), func(b *testing.B) {
			s := benchState(n, 10_000)
			o := &owner{self: "replica-0", state: s}
			var full, digest, fetch int
			for b.Loop() {
				full = len(appendState(nil, 1, s))
				digest = len(o.encodeDigest(1))
				sum := s.summary("replica-1")
				fetch = len(appendFetch(nil, &fetchMsg{From: "replica-0", Origins: []fetchOrigin{o.fetchOrigin("replica-1", sum, sum)}}))
			}
			perReplica := 2 / DefaultConfig().PushPullInterval.Seconds()
			b.ReportMetric(float64(full), "full_state_B")
			b.ReportMetric(float64(full)*perReplica, "full_state_B/s/replica")
			b.ReportMetric(float64(digest), "digest_B")
			b.ReportMetric(float64(digest)*perReplica, "digest_B/s/replica")
			b.ReportMetric(float64(fetch), "fetch_origin_B")
		})
	}
}
