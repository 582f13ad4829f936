package kvingest

import (
	"flag"
	"fmt"
	"time"
)

// Config configures a Subscriber.
type Config struct {
	// Cluster names the NATS subject tree (wire.NewSubjects).
	Cluster string
	// ApplyShards is the number of goroutines applying batches; each owns the
	// workers hashing to it, so one worker's batches stay in order.
	ApplyShards int
	// PendingMsgs bounds the messages NATS buffers for the KV subscription
	// before it drops them as a slow consumer; drops become gaps that are
	// repaired by dumps.
	PendingMsgs int
	// DumpTimeout bounds one whole dump exchange.
	DumpTimeout time.Duration
	// DumpRetry is the first wait before retrying a failed dump; it doubles
	// up to DumpRetryMax.
	DumpRetry    time.Duration
	DumpRetryMax time.Duration
	// DumpChunkBlocks is the chunk size asked of the worker (0: its default).
	DumpChunkBlocks int
	// SweepInterval is how often expired predicted entries are removed.
	SweepInterval time.Duration
	// SilentWindow and SilentBlocks judge a dead event path (Silence): a
	// worker publishing events that computed SilentBlocks prompt blocks
	// within SilentWindow while none reached the index. Two minutes is
	// many event batches (engines publish within a second) yet short
	// enough for an alert to catch a worker that never worked.
	SilentWindow time.Duration
	SilentBlocks int
}

// DefaultConfig returns the defaults of every Subscriber setting.
func DefaultConfig() Config {
	return Config{
		Cluster:         "default",
		ApplyShards:     2,
		PendingMsgs:     65536,
		DumpTimeout:     10 * time.Second,
		DumpRetry:       100 * time.Millisecond,
		DumpRetryMax:    10 * time.Second,
		DumpChunkBlocks: 0,
		SweepInterval:   time.Second,
		SilentWindow:    2 * time.Minute,
		SilentBlocks:    64,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Cluster == "":
		return fmt.Errorf("kvingest: Cluster is empty")
	case c.ApplyShards < 1 || c.ApplyShards > 64:
		return fmt.Errorf("kvingest: ApplyShards %d out of [1, 64]", c.ApplyShards)
	case c.PendingMsgs < 1:
		return fmt.Errorf("kvingest: PendingMsgs %d must be positive", c.PendingMsgs)
	case c.DumpTimeout <= 0:
		return fmt.Errorf("kvingest: DumpTimeout %v must be positive", c.DumpTimeout)
	case c.DumpRetry <= 0 || c.DumpRetryMax < c.DumpRetry:
		return fmt.Errorf("kvingest: DumpRetry %v / DumpRetryMax %v invalid", c.DumpRetry, c.DumpRetryMax)
	case c.DumpChunkBlocks < 0:
		return fmt.Errorf("kvingest: DumpChunkBlocks %d must not be negative", c.DumpChunkBlocks)
	case c.SweepInterval <= 0:
		return fmt.Errorf("kvingest: SweepInterval %v must be positive", c.SweepInterval)
	case c.SilentWindow <= 0:
		return fmt.Errorf("kvingest: SilentWindow %v must be positive", c.SilentWindow)
	case c.SilentBlocks < 1:
		return fmt.Errorf("kvingest: SilentBlocks %d must be positive", c.SilentBlocks)
	}
	return nil
}

// RegisterFlags registers the settings on fs, each named prefix+name.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Cluster, prefix+"cluster", c.Cluster, "cluster name (NATS subject prefix)")
	fs.IntVar(&c.ApplyShards, prefix+"apply-shards", c.ApplyShards, "goroutines applying KV event batches")
	fs.IntVar(&c.PendingMsgs, prefix+"pending-msgs", c.PendingMsgs, "KV event messages NATS buffers before dropping")
	fs.DurationVar(&c.DumpTimeout, prefix+"dump-timeout", c.DumpTimeout, "timeout of one KV dump exchange")
	fs.DurationVar(&c.DumpRetry, prefix+"dump-retry", c.DumpRetry, "first backoff after a failed KV dump")
	fs.DurationVar(&c.DumpRetryMax, prefix+"dump-retry-max", c.DumpRetryMax, "maximum backoff after failed KV dumps")
	fs.IntVar(&c.DumpChunkBlocks, prefix+"dump-chunk-blocks", c.DumpChunkBlocks, "blocks per KV dump chunk asked of workers (0: worker default)")
	fs.DurationVar(&c.SweepInterval, prefix+"sweep-interval", c.SweepInterval, "interval between sweeps of expired predicted entries")
	fs.DurationVar(&c.SilentWindow, prefix+"silent-window", c.SilentWindow, "window over which a worker's KV events must store a block once it computed -ingest.silent-blocks prompt blocks")
	fs.IntVar(&c.SilentBlocks, prefix+"silent-blocks", c.SilentBlocks, "prompt blocks a worker computes within -ingest.silent-window before storing none flags its KV events silent")
}
