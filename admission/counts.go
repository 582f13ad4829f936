package admission

import (
	"maps"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/scheduler"
)

// Counts returns the entry side's cumulative counters as an exporter
// snapshot: every request this replica received for admission, counted once
// here whatever happened to its attempts at owners (moved, died, fenced),
// and the rejections decided here before any owner answered. Owners count
// admissions, cancellations, retries and their own rejections; the app
// exports their received counts as zero, so received is counted once.
func (c *Client) Counts(workerType string) metrics.AdmissionSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	out := metrics.AdmissionSnapshot{Instance: c.instance, Seq: c.seq, WorkerType: workerType,
		Classes: make(map[string]metrics.AdmissionCounts, len(c.counts))}
	for class, n := range c.counts {
		cp := *n
		cp.Rejected = maps.Clone(n.Rejected)
		out.Classes[class] = cp
	}
	return out
}

func (c *Client) countLocked(class string) *metrics.AdmissionCounts {
	n := c.counts[class]
	if n == nil {
		n = &metrics.AdmissionCounts{Rejected: map[string]uint64{}}
		c.counts[class] = n
	}
	return n
}

// entryReject counts a rejection decided at the entry (no owner answered).
func (c *Client) entryReject(class string, reason scheduler.Reason) {
	c.m.entryRejected.WithLabelValues(reason.String()).Inc()
	c.mu.Lock()
	c.countLocked(class).Rejected[reason.String()]++
	c.mu.Unlock()
}
