package engine

import (
	"flag"
	"fmt"
)

// Config configures one engine. Defaults live in DefaultConfig.
type Config struct {
	// WorkerID names the engine in its KV event batches and dumps.
	WorkerID string
	// BlockSize is the number of tokens per KV block.
	BlockSize int
	// NumBlocks is the size of the KV pool in blocks.
	NumBlocks int
	// MaxNumBatchedTokens is the per-step token budget shared by decodes and
	// prefill chunks.
	MaxNumBatchedTokens int
	// MaxNumSeqs bounds the running set (prefilling plus decoding).
	MaxNumSeqs int
	// MaxModelLen bounds prompt plus output tokens of one request.
	MaxModelLen int
	// MaxWaiting bounds the waiting queue; Submit returns ErrQueueFull beyond
	// it. Zero means unbounded.
	MaxWaiting int
	// WatermarkFraction of the pool is kept free when admitting a waiting
	// request, so running requests can grow without immediate preemption.
	WatermarkFraction float64
	// Speedup divides every step time of the default timing model.
	Speedup float64
	// Seed makes synthetic output tokens deterministic: a token depends only
	// on Seed, the request id and its position.
	Seed uint64
	// Instance identifies this engine start in its event stream. Zero picks a
	// random non-zero value in New; a simulator sets it for determinism.
	Instance uint64

	// HostBlocks sizes the host tier (host.go) in blocks; 0 runs without
	// one. HostLoadMsPerToken is the time a token's KV takes to load back
	// from it: KV bytes per token over the host-to-GPU bandwidth (default
	// 128 KiB at 20 GB/s, 0.0066 ms).
	HostBlocks         int
	HostLoadMsPerToken float64
	// DiskBlocks sizes the disk tier (disk.go) below the host tier in
	// blocks; 0 runs without one, and it needs a host tier.
	// DiskLoadMsPerToken is a token's load time from it (default 128 KiB
	// at 2 GB/s, 0.066 ms: local NVMe, ten times the host tier's).
	DiskBlocks         int
	DiskLoadMsPerToken float64

	// The KV transfer model of disaggregated serving (transfer.go):
	// KVBytesPerToken is ModelLayers × KVHeads × HeadDim × 2 × KVDTypeBytes
	// and TransferTime(tokens) is TransferSetupMs + tokens ×
	// KVBytesPerToken over a TransferGbps link. Defaults: Llama 3.1 8B in
	// bf16 (32 × 8 × 128 × 2 × 2 = 128 KiB per token) over a 200 Gb/s
	// RDMA link with 1 ms setup per pull.
	ModelLayers     int
	KVHeads         int
	HeadDim         int
	KVDTypeBytes    int
	TransferGbps    float64
	TransferSetupMs float64

	// Timing computes step durations; nil means Polynomial{Speedup}.
	Timing TimingModel `json:"-"`
	// Events receives KV event batches; nil discards them (ids still
	// advance, so a later dump stays consistent).
	Events EventSink `json:"-"`
}

// DefaultConfig returns the defaults: 65,536 blocks of 16 tokens, a budget of
// 8192 tokens and 256 sequences per step.
func DefaultConfig() Config {
	return Config{
		WorkerID:            "engine",
		BlockSize:           16,
		NumBlocks:           65536,
		MaxNumBatchedTokens: 8192,
		MaxNumSeqs:          256,
		MaxModelLen:         32768,
		MaxWaiting:          0,
		WatermarkFraction:   0.01,
		Speedup:             1,
		HostLoadMsPerToken:  131072.0 / 20e6,
		DiskLoadMsPerToken:  131072.0 / 2e6,
		ModelLayers:         DefaultModelLayers,
		KVHeads:             DefaultKVHeads,
		HeadDim:             DefaultHeadDim,
		KVDTypeBytes:        DefaultKVDTypeBytes,
		TransferGbps:        DefaultTransferGbps,
		TransferSetupMs:     DefaultTransferSetupMs,
	}
}

// Validate names the first bad field.
func (c *Config) Validate() error {
	switch {
	case c.BlockSize <= 0:
		return fmt.Errorf("engine config: BlockSize %d must be positive", c.BlockSize)
	case c.NumBlocks <= 0:
		return fmt.Errorf("engine config: NumBlocks %d must be positive", c.NumBlocks)
	case c.NumBlocks > 1<<30:
		return fmt.Errorf("engine config: NumBlocks %d exceeds %d", c.NumBlocks, 1<<30)
	case c.MaxNumBatchedTokens <= 0:
		return fmt.Errorf("engine config: MaxNumBatchedTokens %d must be positive", c.MaxNumBatchedTokens)
	case c.MaxNumSeqs <= 0:
		return fmt.Errorf("engine config: MaxNumSeqs %d must be positive", c.MaxNumSeqs)
	case c.MaxModelLen <= 1:
		return fmt.Errorf("engine config: MaxModelLen %d must exceed 1", c.MaxModelLen)
	case c.MaxWaiting < 0:
		return fmt.Errorf("engine config: MaxWaiting %d must not be negative", c.MaxWaiting)
	case !(c.WatermarkFraction >= 0 && c.WatermarkFraction < 1):
		return fmt.Errorf("engine config: WatermarkFraction %v must be in [0,1)", c.WatermarkFraction)
	case !(c.Speedup > 0) || c.Speedup > 1e9:
		return fmt.Errorf("engine config: Speedup %v must be positive", c.Speedup)
	case c.HostBlocks < 0 || c.HostBlocks > 1<<30:
		return fmt.Errorf("engine config: HostBlocks %d must be in [0, %d]", c.HostBlocks, 1<<30)
	case !(c.HostLoadMsPerToken >= 0) || c.HostLoadMsPerToken > 1e3:
		return fmt.Errorf("engine config: HostLoadMsPerToken %v must be in [0, 1000]", c.HostLoadMsPerToken)
	case c.DiskBlocks < 0 || c.DiskBlocks > 1<<30:
		return fmt.Errorf("engine config: DiskBlocks %d must be in [0, %d]", c.DiskBlocks, 1<<30)
	case c.DiskBlocks > 0 && c.HostBlocks == 0:
		return fmt.Errorf("engine config: DiskBlocks %d needs a host tier (HostBlocks > 0): the disk tier holds what the host tier evicts", c.DiskBlocks)
	case !(c.DiskLoadMsPerToken >= 0) || c.DiskLoadMsPerToken > 1e3:
		return fmt.Errorf("engine config: DiskLoadMsPerToken %v must be in [0, 1000]", c.DiskLoadMsPerToken)
	}
	return c.validateTransfer()
}

// RegisterFlags registers the engine's flags under prefix (e.g. "engine.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.IntVar(&c.BlockSize, prefix+"block-size", c.BlockSize, "tokens per KV block")
	fs.IntVar(&c.NumBlocks, prefix+"kv-blocks", c.NumBlocks, "KV pool size in blocks")
	fs.IntVar(&c.MaxNumBatchedTokens, prefix+"max-batched-tokens", c.MaxNumBatchedTokens, "token budget per engine step")
	fs.IntVar(&c.MaxNumSeqs, prefix+"max-num-seqs", c.MaxNumSeqs, "maximum running sequences")
	fs.IntVar(&c.MaxModelLen, prefix+"max-model-len", c.MaxModelLen, "maximum prompt plus output tokens per request")
	fs.IntVar(&c.MaxWaiting, prefix+"max-waiting", c.MaxWaiting, "maximum waiting requests (0: unbounded)")
	fs.Float64Var(&c.WatermarkFraction, prefix+"watermark", c.WatermarkFraction, "fraction of KV blocks kept free when admitting")
	fs.Float64Var(&c.Speedup, prefix+"speedup", c.Speedup, "divide every simulated step time by this factor")
	fs.Uint64Var(&c.Seed, prefix+"seed", c.Seed, "seed of the synthetic output tokens")
	fs.IntVar(&c.HostBlocks, prefix+"host-blocks", c.HostBlocks, "host-memory KV tier in blocks: GPU-evicted blocks are copied there and load back at -host-load-ms-per-token (0: no host tier)")
	fs.Float64Var(&c.HostLoadMsPerToken, prefix+"host-load-ms-per-token", c.HostLoadMsPerToken, "ms a token's KV takes to load back from the host tier")
	fs.IntVar(&c.DiskBlocks, prefix+"disk-blocks", c.DiskBlocks, "disk KV tier in blocks, below the host tier: blocks the host tier evicts are written there and load back at -disk-load-ms-per-token (0: no disk tier; needs -host-blocks)")
	fs.Float64Var(&c.DiskLoadMsPerToken, prefix+"disk-load-ms-per-token", c.DiskLoadMsPerToken, "ms a token's KV takes to load back from the disk tier")
}

// RegisterTransferFlags registers the KV transfer model's flags under
// prefix: the flags of a worker that serves a disaggregated role (the plain
// RegisterFlags leaves them out, so an aggregated worker does not grow them).
func (c *Config) RegisterTransferFlags(fs *flag.FlagSet, prefix string) {
	fs.IntVar(&c.ModelLayers, prefix+"model-layers", c.ModelLayers, "model layers, for the KV bytes per token of a transfer")
	fs.IntVar(&c.KVHeads, prefix+"kv-heads", c.KVHeads, "KV heads per layer, for the KV bytes per token of a transfer")
	fs.IntVar(&c.HeadDim, prefix+"head-dim", c.HeadDim, "attention head dimension, for the KV bytes per token of a transfer")
	fs.IntVar(&c.KVDTypeBytes, prefix+"kv-dtype-bytes", c.KVDTypeBytes, "bytes per KV element (2: bf16/fp16, 1: fp8)")
	fs.Float64Var(&c.TransferGbps, prefix+"transfer-gbps", c.TransferGbps, "prefill-to-decode KV link bandwidth in Gb/s")
	fs.Float64Var(&c.TransferSetupMs, prefix+"transfer-setup-ms", c.TransferSetupMs, "fixed cost of one KV transfer in ms")
}
