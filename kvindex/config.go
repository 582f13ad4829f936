package kvindex

import (
	"flag"
	"fmt"
	"time"
)

// Config configures an Index.
type Config struct {
	// MaxWorkers bounds the number of workers the index tracks at once.
	// Worker ids are interned to 16 bits, so it is at most 65534.
	MaxWorkers int
	// DefaultWorkerBlocks is a worker's block capacity until SetCapacity
	// tells the index its real KV size (wire.WorkerInfo.KVBlocks).
	DefaultWorkerBlocks int
	// CapacitySlackPercent lets a worker's indexed blocks exceed its KV size
	// by this much before the index concludes it missed removals and
	// resynchronises it; engines may publish a store before the eviction that
	// made room for it.
	CapacitySlackPercent int
	// MaxBufferedBatches bounds the batches kept for one worker while its
	// dump is in flight. When full the buffer is dropped (counted) and the
	// replay after the dump detects the gap and fetches another dump.
	MaxBufferedBatches int
	// MaxPredictedEntries bounds (hash, worker) predicted entries; Predict
	// beyond it drops the excess (counted).
	MaxPredictedEntries int
}

// DefaultConfig returns the defaults of every Index setting.
func DefaultConfig() Config {
	return Config{
		MaxWorkers:           1024,
		DefaultWorkerBlocks:  1 << 16,
		CapacitySlackPercent: 5,
		MaxBufferedBatches:   4096,
		MaxPredictedEntries:  1 << 20,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.MaxWorkers < 1 || c.MaxWorkers > maxWorkerID:
		return fmt.Errorf("kvindex: MaxWorkers %d out of [1, %d]", c.MaxWorkers, maxWorkerID)
	case c.DefaultWorkerBlocks < 1:
		return fmt.Errorf("kvindex: DefaultWorkerBlocks %d must be positive", c.DefaultWorkerBlocks)
	case c.CapacitySlackPercent < 0:
		return fmt.Errorf("kvindex: CapacitySlackPercent %d must not be negative", c.CapacitySlackPercent)
	case c.MaxBufferedBatches < 1:
		return fmt.Errorf("kvindex: MaxBufferedBatches %d must be positive", c.MaxBufferedBatches)
	case c.MaxPredictedEntries < 0:
		return fmt.Errorf("kvindex: MaxPredictedEntries %d must not be negative", c.MaxPredictedEntries)
	}
	return nil
}

// RegisterFlags registers the settings on fs, each named prefix+name.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.IntVar(&c.MaxWorkers, prefix+"max-workers", c.MaxWorkers, "maximum number of workers tracked by the KV index")
	fs.IntVar(&c.DefaultWorkerBlocks, prefix+"default-worker-blocks", c.DefaultWorkerBlocks, "block capacity assumed for a worker until its KV size is known")
	fs.IntVar(&c.CapacitySlackPercent, prefix+"capacity-slack-percent", c.CapacitySlackPercent, "percent a worker's indexed blocks may exceed its KV size before a resync")
	fs.IntVar(&c.MaxBufferedBatches, prefix+"max-buffered-batches", c.MaxBufferedBatches, "event batches buffered per worker while its dump is in flight")
	fs.IntVar(&c.MaxPredictedEntries, prefix+"max-predicted-entries", c.MaxPredictedEntries, "maximum predicted (block, worker) entries")
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
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
}

// DefaultSubscriberConfig returns the defaults of every Subscriber setting.
func DefaultSubscriberConfig() SubscriberConfig {
	return SubscriberConfig{
		Cluster:         "default",
		ApplyShards:     2,
		PendingMsgs:     65536,
		DumpTimeout:     10 * time.Second,
		DumpRetry:       100 * time.Millisecond,
		DumpRetryMax:    10 * time.Second,
		DumpChunkBlocks: 0,
		SweepInterval:   time.Second,
	}
}

// Validate names the first bad field.
func (c SubscriberConfig) Validate() error {
	switch {
	case c.Cluster == "":
		return fmt.Errorf("kvindex: subscriber Cluster is empty")
	case c.ApplyShards < 1 || c.ApplyShards > 64:
		return fmt.Errorf("kvindex: subscriber ApplyShards %d out of [1, 64]", c.ApplyShards)
	case c.PendingMsgs < 1:
		return fmt.Errorf("kvindex: subscriber PendingMsgs %d must be positive", c.PendingMsgs)
	case c.DumpTimeout <= 0:
		return fmt.Errorf("kvindex: subscriber DumpTimeout %v must be positive", c.DumpTimeout)
	case c.DumpRetry <= 0 || c.DumpRetryMax < c.DumpRetry:
		return fmt.Errorf("kvindex: subscriber DumpRetry %v / DumpRetryMax %v invalid", c.DumpRetry, c.DumpRetryMax)
	case c.DumpChunkBlocks < 0:
		return fmt.Errorf("kvindex: subscriber DumpChunkBlocks %d must not be negative", c.DumpChunkBlocks)
	case c.SweepInterval <= 0:
		return fmt.Errorf("kvindex: subscriber SweepInterval %v must be positive", c.SweepInterval)
	}
	return nil
}

// RegisterFlags registers the settings on fs, each named prefix+name.
func (c *SubscriberConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Cluster, prefix+"cluster", c.Cluster, "cluster name (NATS subject prefix)")
	fs.IntVar(&c.ApplyShards, prefix+"apply-shards", c.ApplyShards, "goroutines applying KV event batches")
	fs.IntVar(&c.PendingMsgs, prefix+"pending-msgs", c.PendingMsgs, "KV event messages NATS buffers before dropping")
	fs.DurationVar(&c.DumpTimeout, prefix+"dump-timeout", c.DumpTimeout, "timeout of one KV dump exchange")
	fs.DurationVar(&c.DumpRetry, prefix+"dump-retry", c.DumpRetry, "first backoff after a failed KV dump")
	fs.DurationVar(&c.DumpRetryMax, prefix+"dump-retry-max", c.DumpRetryMax, "maximum backoff after failed KV dumps")
	fs.IntVar(&c.DumpChunkBlocks, prefix+"dump-chunk-blocks", c.DumpChunkBlocks, "blocks per KV dump chunk asked of workers (0: worker default)")
	fs.DurationVar(&c.SweepInterval, prefix+"sweep-interval", c.SweepInterval, "interval between sweeps of expired predicted entries")
}
