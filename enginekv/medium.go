package enginekv

import (
	"errors"
	"fmt"
	"strings"
)

// ErrUnknownMedium is returned by Event.Tier for a medium no engine we
// know publishes. It wraps ErrMalformed: a consumer that cannot place a
// block must not guess its tier.
var ErrUnknownMedium = fmt.Errorf("%w: unknown KV medium", ErrMalformed)

// Medium is the storage tier of a KV block as the router prices it: where
// the engine would load it from before it can reuse it.
type Medium uint8

// The tiers. The zero value is not a tier, so a forgotten assignment shows.
const (
	// MediumGPU: the engine's own paged KV cache (vLLM "GPU", SGLang
	// "GPU"; also a block without a medium, as every engine before
	// offloading sent).
	MediumGPU Medium = iota + 1
	// MediumCPU: host memory (vLLM's offloading connector "CPU", SGLang's
	// hierarchical cache "CPU_PINNED").
	MediumCPU
	// MediumDisk: local disk or a remote store (vLLM "DISK", SGLang's
	// third tier "EXTERNAL"); both are priced at the disk bandwidth.
	MediumDisk
	// NumMedia bounds the tiers, for arrays indexed by Medium.
	NumMedia
)

func (m Medium) String() string {
	switch m {
	case MediumGPU:
		return "gpu"
	case MediumCPU:
		return "cpu"
	case MediumDisk:
		return "disk"
	}
	return fmt.Sprintf("medium(%d)", uint8(m))
}

// ParseMedium reads a medium as engines write it ("GPU", "CPU",
// "CPU_PINNED", "DISK", "EXTERNAL", in any case; "" is GPU) or as String
// writes it. Anything else is an error wrapping ErrUnknownMedium.
func ParseMedium(s string) (Medium, error) {
	switch s {
	case "", "GPU", "gpu":
		return MediumGPU, nil
	case "CPU", "CPU_PINNED", "cpu":
		return MediumCPU, nil
	case "DISK", "EXTERNAL", "disk":
		return MediumDisk, nil
	}
	switch strings.ToUpper(s) {
	case "GPU":
		return MediumGPU, nil
	case "CPU", "CPU_PINNED":
		return MediumCPU, nil
	case "DISK", "EXTERNAL":
		return MediumDisk, nil
	}
	return 0, fmt.Errorf("%w %q", ErrUnknownMedium, s)
}

// Tier is the event's medium, typed. The decoder keeps the medium as the
// engine wrote it (so a batch re-encodes to the same bytes) and this
// parses it on demand: an unknown medium costs the consumer one event,
// not the batch (a lost batch would reset the whole mirror).
func (e *Event) Tier() (Medium, error) { return ParseMedium(e.Medium) }

// IsUnknownMedium reports whether err is Tier's error for an unknown medium.
func IsUnknownMedium(err error) bool { return errors.Is(err, ErrUnknownMedium) }
