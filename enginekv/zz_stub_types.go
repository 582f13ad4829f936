// Stub until the enginekv branch merges; the lead deletes this file.
package enginekv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// EventKind is the kind of one engine KV event.
type EventKind uint8

// The engine KV event kinds.
const (
	BlockStored EventKind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "block_stored"
	case BlockRemoved:
		return "block_removed"
	case AllBlocksCleared:
		return "all_blocks_cleared"
	}
	return fmt.Sprintf("event_kind(%d)", uint8(k))
}

// Event is one decoded engine KV event.
type Event struct {
	Kind        EventKind
	BlockHashes []uint64
	ParentHash  uint64
	HasParent   bool
	TokenIDs    []uint32
	BlockSize   int
	LoRAID      int
	LoRAName    string
	Medium      string
	GroupIdx    int
}

// Batch is one decoded engine event batch.
type Batch struct {
	Topic   string
	Seq     uint64
	TS      float64
	DPRank  int
	Events  []Event
	Unknown int
}

// ResetReason says why continuity with the engine's stream was lost.
type ResetReason uint8

// Reset reasons.
const (
	ResetRestart ResetReason = iota + 1
	ResetGapNoReplay
	ResetReplayFailed
)

func (r ResetReason) String() string {
	switch r {
	case ResetRestart:
		return "restart"
	case ResetGapNoReplay:
		return "gap_without_replay"
	case ResetReplayFailed:
		return "replay_failed"
	}
	return fmt.Sprintf("reset_reason(%d)", uint8(r))
}

// Handler consumes a subscriber's batches.
type Handler interface {
	Batch(b Batch)
	Reset(reason ResetReason)
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	Endpoint       string
	Bind           bool
	ReplayEndpoint string
	Topic          string
	ReplayTimeout  time.Duration
}

// Subscriber is a stub.
type Subscriber struct{}

// NewSubscriber is a stub.
func NewSubscriber(cfg SubscriberConfig, h Handler, log *zap.Logger, reg prometheus.Registerer) (*Subscriber, error) {
	return &Subscriber{}, nil
}

// Run is a stub that fails.
func (s *Subscriber) Run(ctx context.Context) error { return errors.New("stub") }
