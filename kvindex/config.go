package kvindex

import (
	"flag"
	"fmt"
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
	// Sample makes the index keep about one block hash in Sample (1: every
	// block), chosen by Sampled. Sequence hashes are chained, so one kept
	// hash still names its whole prefix: lookups walk only the kept
	// positions and report a worker's depth as the position of its last
	// matched kept hash plus one, under-estimating it by the gap to the next
	// kept position (Sample blocks on average). Ingest and index memory
	// shrink by about Sample. See docs/architecture.md, "Sampled index".
	Sample int
}

// DefaultConfig returns the defaults of every Index setting.
func DefaultConfig() Config {
	return Config{
		MaxWorkers:           1024,
		DefaultWorkerBlocks:  1 << 16,
		CapacitySlackPercent: 5,
		MaxBufferedBatches:   4096,
		MaxPredictedEntries:  1 << 20,
		Sample:               1,
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
	case c.Sample < 1 || c.Sample > MaxSample:
		return fmt.Errorf("kvindex: Sample %d out of [1, %d]", c.Sample, MaxSample)
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
	fs.IntVar(&c.Sample, prefix+"sample", c.Sample, "index about one block hash in this many (1: every block); depths are then under-estimated by up to the gap to the next kept block")
}
