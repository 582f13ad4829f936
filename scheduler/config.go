package scheduler

import (
	"flag"
	"fmt"
	"math"
	"time"
)

// Config holds the scheduler's knobs (design §5). Classes and workers are
// not configuration here: they change at run time (SetClasses, SetWorkers).
type Config struct {
	// OverlapCredit is how many prefill blocks one cached block is worth.
	OverlapCredit float64
	// PrefillScale weighs prefill against decode load in the blocks
	// selector's cost (the ttft selector has its own, TTFT.PrefillScale).
	PrefillScale float64
	// Temperature 0 picks the cheapest worker (ties at random); > 0 samples
	// with p ∝ exp(−(c − c_min) / ((c_max − c_min)·T)).
	Temperature float64
	// AckTimeout frees a grant nobody acknowledged (design §4 step 4). The
	// owner cannot tell a grant whose reply was lost from one whose entry's
	// dispatched (and first_token) marks were lost while the worker runs
	// it, so freeing it early oversubscribes the worker (the nemesis's
	// life_drop: 4 requests on a worker with cap 2 at 2 s). The default is
	// therefore the renewal window, BookingExpiry: an unacknowledged grant
	// is held until the entry's first renewal acknowledges it (entries renew
	// every 10 s) or its renewals never come, as for an acknowledged
	// booking. Grants an entry knows it lost (reply timeout, lost
	// connection, fenced grant) are freed at once by its cancel
	// (Core.CancelAttempt). A value below the entries' renew interval brings
	// the oversubscription back when a mark is lost.
	AckTimeout time.Duration
	// BookingExpiry frees an acknowledged booking not renewed for this long
	// (a lost done/aborted mark heals, design §4 step 5).
	BookingExpiry time.Duration
	// SnapshotInterval is the least time between two snapshots the Actor
	// publishes; building one is O(classes + workers), too much per admission.
	SnapshotInterval time.Duration
	// Selector is the worker-selection cost: SelectorBlocks (design §5's
	// block counts) or SelectorTTFT (predicted time to first token,
	// selector_ttft.go). OverlapCredit and Temperature apply to both.
	Selector Selector
	// TTFT is the timing model SelectorTTFT predicts with.
	TTFT TTFTModel
	// Disagg is the prefill/decode decider's transfer model and default
	// threshold (disagg.go).
	Disagg DisaggConfig
	// IndexKeeps reports whether the KV index that reports the requests'
	// overlaps keeps a block hash (a sampled index keeps about one in N:
	// kvindex.Sampled). Overlaps are then reported only at kept positions,
	// and the herd band keys its rendezvous draw by the first kept hash past
	// the deepest report, the first block the index would have reported had
	// any worker held it (herd.go). nil: the index keeps every hash.
	IndexKeeps func(hash uint64) bool
}

// DefaultConfig returns the defaults: the ttft selector with
// DefaultTTFTModel, credit 1, blocks scale 1, temperature 0, ack timeout
// 30 s (the booking expiry, see AckTimeout), booking expiry 30 s, snapshots every 100 ms.
func DefaultConfig() Config {
	return Config{
		OverlapCredit:    1,
		PrefillScale:     1,
		Temperature:      0,
		AckTimeout:       30 * time.Second,
		BookingExpiry:    30 * time.Second,
		SnapshotInterval: 100 * time.Millisecond,
		Selector:         SelectorTTFT,
		TTFT:             DefaultTTFTModel(),
		Disagg:           DefaultDisaggConfig(),
	}
}

// Validate reports the first bad field.
func (c Config) Validate() error {
	bad := func(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) || f < 0 }
	switch {
	case bad(c.OverlapCredit):
		return fmt.Errorf("%w: OverlapCredit must be a finite number >= 0, got %v", ErrInvalidConfig, c.OverlapCredit)
	case bad(c.PrefillScale):
		return fmt.Errorf("%w: PrefillScale must be a finite number >= 0, got %v", ErrInvalidConfig, c.PrefillScale)
	case bad(c.Temperature):
		return fmt.Errorf("%w: Temperature must be a finite number >= 0, got %v", ErrInvalidConfig, c.Temperature)
	case c.AckTimeout <= 0:
		return fmt.Errorf("%w: AckTimeout must be > 0, got %v", ErrInvalidConfig, c.AckTimeout)
	case c.BookingExpiry <= 0:
		return fmt.Errorf("%w: BookingExpiry must be > 0, got %v", ErrInvalidConfig, c.BookingExpiry)
	case c.SnapshotInterval <= 0:
		return fmt.Errorf("%w: SnapshotInterval must be > 0, got %v", ErrInvalidConfig, c.SnapshotInterval)
	case c.Selector != SelectorBlocks && c.Selector != SelectorTTFT:
		return fmt.Errorf("%w: Selector must be blocks or ttft, got %d", ErrInvalidConfig, int(c.Selector))
	}
	if err := c.Disagg.Validate(); err != nil {
		return err
	}
	return c.TTFT.Validate()
}

// RegisterFlags registers the fields as flags named prefix+"overlap-credit"
// and so on, with the receiver's current values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.Float64Var(&c.OverlapCredit, prefix+"overlap-credit", c.OverlapCredit, "prefill blocks one cached block is worth in worker selection")
	fs.Float64Var(&c.PrefillScale, prefix+"prefill-scale", c.PrefillScale, "weight of prefill load against decode load in worker selection")
	fs.Float64Var(&c.Temperature, prefix+"temperature", c.Temperature, "worker selection temperature (0 = cheapest worker)")
	fs.DurationVar(&c.AckTimeout, prefix+"ack-timeout", c.AckTimeout, "free grants not acknowledged within this time (keep it above the entries' renew interval, 10 s)")
	fs.DurationVar(&c.BookingExpiry, prefix+"booking-expiry", c.BookingExpiry, "free bookings not renewed within this time")
	fs.DurationVar(&c.SnapshotInterval, prefix+"snapshot-interval", c.SnapshotInterval, "least time between published scheduler snapshots")
	fs.TextVar(&c.Selector, prefix+"selector", c.Selector, "worker selection cost: ttft (predicted time to first token) or blocks (block counts)")
	c.TTFT.RegisterFlags(fs, prefix+"ttft-")
}

// Validate reports the first bad field of a worker registration.
func (w Worker) Validate() error {
	switch {
	case w.ID == "":
		return fmt.Errorf("%w: worker ID is empty", ErrInvalidConfig)
	case w.BlockSize <= 0:
		return fmt.Errorf("%w: worker %s: BlockSize must be > 0, got %d", ErrInvalidConfig, w.ID, w.BlockSize)
	case w.KVBlocks < 0:
		return fmt.Errorf("%w: worker %s: KVBlocks must be >= 0, got %d", ErrInvalidConfig, w.ID, w.KVBlocks)
	case w.MaxRunning < 0:
		return fmt.Errorf("%w: worker %s: MaxRunning must be >= 0, got %d", ErrInvalidConfig, w.ID, w.MaxRunning)
	}
	return nil
}
