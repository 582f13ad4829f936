package engine

import (
	"container/heap"
	"fmt"
	"slices"
	"time"
)

// Disaggregated prefill and decode. A prefill-role request needs nothing
// new: it is an ordinary request with MaxTokens 1, and its computed prompt
// blocks stay in the prefix cache, where the decode engine pulls them from.
// (A real prefill engine also pins them until the pull ends; the simulated
// decode engine's Transfer carries the pull's outcome, so nothing here waits
// on the prefill side.)
//
// A decode-role request carries a Transfer: the first Tokens of its prompt
// arrive as KV from the prefill engine instead of being computed here. The
// engine follows vLLM's v1 scheduler with the NixlConnector (read in vLLM
// 0.10/0.11: vllm/v1/core/sched/scheduler.py, WAITING_FOR_REMOTE_KVS and
// _update_waiting_for_remote_kv; kv_connector/v1/nixl_connector.py): when the request reaches the head
// of the waiting queue the engine allocates the blocks the pull fills (after
// its own prefix hits, which are not pulled) and parks the request, which
// then takes no step budget and no sequence slot and holds up nobody's
// batch; Delay later the KV has landed, the blocks are committed and
// published as stored events (a decode engine publishes blocks whose parent
// it may never have stored), and the request goes back to the waiting queue
// with those tokens computed, to prefill only the remainder. As in vLLM, at
// least the last prompt token is always computed, so at most len(Prompt)−1
// tokens are taken from a transfer.

// Transfer describes the KV a decode-role request pulls from a prefill engine.
type Transfer struct {
	// Tokens is the length of the prompt prefix whose KV arrives from the
	// prefill engine (capped at len(Prompt)−1; tokens the engine already
	// caches itself are not pulled).
	Tokens int
	// Delay is how long the pull takes once blocks are allocated.
	Delay time.Duration
	// Modeled ignores Delay: the pull takes Config.TransferTime of the
	// tokens actually pulled (those after the engine's own prefix hit).
	Modeled bool
}

// The model shape and link behind Config.TransferTime's defaults: Llama 3.1
// 8B in bf16 (32 layers, 8 KV heads of dimension 128: 128 KiB of K and V per
// token, the same figure HostLoadMsPerToken assumes), over one 200 Gb/s RDMA
// NIC (ConnectX-7 / HDR InfiniBand, the class of link NIXL and Mooncake's
// transfer engine run on), with 1 ms of fixed setup per pull (handshake,
// descriptor exchange and notification; Mooncake's paper (FAST '25) and
// NIXL's benchmarks put per-transfer overhead in the sub-millisecond to
// millisecond range).
const (
	DefaultModelLayers        = 32
	DefaultKVHeads            = 8
	DefaultHeadDim            = 128
	DefaultKVDTypeBytes       = 2
	DefaultTransferGbps       = 200
	DefaultTransferSetupMs    = 1
	maxTransferShapeProduct   = 1 << 40
	transferBitsPerGigabit    = 1e9
	transferBitsPerByte       = 8
	transferMillisPerSecond   = 1e3
	transferKVTensorsPerLayer = 2 // K and V
)

// KVBytesPerToken is layers × KV heads × head dimension × 2 (K and V) ×
// dtype bytes: what one token's KV weighs on the wire.
func (c Config) KVBytesPerToken() int64 {
	return int64(c.ModelLayers) * int64(c.KVHeads) * int64(c.HeadDim) * transferKVTensorsPerLayer * int64(c.KVDTypeBytes)
}

// TransferTime is the time to pull tokens' KV from a prefill engine:
// TransferSetupMs + tokens × KVBytesPerToken ÷ TransferGbps. Zero tokens
// cost nothing (nothing is pulled).
func (c Config) TransferTime(tokens int) time.Duration {
	if tokens <= 0 {
		return 0
	}
	bytes := float64(tokens) * float64(c.KVBytesPerToken())
	sec := bytes * transferBitsPerByte / (c.TransferGbps * transferBitsPerGigabit)
	ms := c.TransferSetupMs + sec*transferMillisPerSecond
	return time.Duration(ms * float64(time.Millisecond))
}

// DisaggThreshold is the smallest uncached prefill, in tokens, for which
// pulling its KV costs less than computing it inside the decode engine's
// batch: TransferTime(T) < prefill(T) − prefill(0) of the Polynomial model
// (the step's fixed cost is paid by the decode batch either way), scaled by
// Speedup. It returns 0 when no T up to MaxModelLen pays.
func (c Config) DisaggThreshold() int {
	sp := c.Speedup
	if !(sp > 0) {
		sp = 1
	}
	for t := c.BlockSize; t <= c.MaxModelLen; t += c.BlockSize {
		saved := (PrefillMillis(t) - PrefillMillis(0)) / sp
		if float64(c.TransferTime(t))/float64(time.Millisecond) < saved {
			return t
		}
	}
	return 0
}

func (c *Config) validateTransfer() error {
	prod := int64(c.ModelLayers) * int64(c.KVHeads) * int64(c.HeadDim) * int64(c.KVDTypeBytes)
	switch {
	case c.ModelLayers <= 0 || c.KVHeads <= 0 || c.HeadDim <= 0 || c.KVDTypeBytes <= 0 ||
		c.ModelLayers > 1<<12 || c.KVHeads > 1<<12 || c.HeadDim > 1<<14 || c.KVDTypeBytes > 8 || prod > maxTransferShapeProduct:
		return fmt.Errorf("engine config: model shape %d layers × %d KV heads × %d head dim × %d bytes is out of range",
			c.ModelLayers, c.KVHeads, c.HeadDim, c.KVDTypeBytes)
	case !(c.TransferGbps > 0) || c.TransferGbps > 1e6:
		return fmt.Errorf("engine config: TransferGbps %v must be in (0, 1e6]", c.TransferGbps)
	case !(c.TransferSetupMs >= 0) || c.TransferSetupMs > 1e4:
		return fmt.Errorf("engine config: TransferSetupMs %v must be in [0, 1e4]", c.TransferSetupMs)
	}
	return nil
}

// admitPull starts the transfer of s, the waiting queue's head, at its
// admission: s has hits blocks of its own prefix cache and pulls the rest of
// its transfer's tokens into blocks allocated now. It reports parked when s
// left the queue to wait for its KV, blocked (nothing changed) when the pool
// cannot hold the blocks, and neither when nothing is left to pull: the
// caller then admits s as an ordinary request.
func (e *Engine) admitPull(s *seq, now time.Time, hits, hitFree int) (parked, blocked bool) {
	bs := e.cfg.BlockSize
	upto := min(s.req.Transfer.Tokens, len(s.tokens)-1)
	if upto <= hits*bs {
		s.pull = pullDone
		return false, false
	}
	need := e.blocksFor(upto) - hits
	if e.pool.nFree-hitFree < need+e.watermark {
		return false, true
	}
	heap.Pop(&e.waiting)
	e.takeBlocks(s, hits, need)
	s.computed, s.nCommitted = hits*bs, hits
	if !s.started {
		s.started = true
		s.cached = hits * bs
		s.transferred = upto - hits*bs
		e.st.PromptTokens += uint64(s.nPrompt)
		e.st.CachedTokens += uint64(s.cached)
	}
	s.pull = pulling
	s.pullTokens = upto
	delay := s.req.Transfer.Delay
	if s.req.Transfer.Modeled {
		delay = e.cfg.TransferTime(s.transferred)
	}
	s.pullReady = now.Add(max(delay, 0))
	s.state = statePulling
	e.pulls = append(e.pulls, s)
	e.st.Transferring = len(e.pulls)
	return true, false
}

// landPulls completes the transfers whose KV has arrived by now: their
// blocks are committed (stored events) and the requests go back to the
// waiting queue, keeping their blocks, to prefill the remainder.
func (e *Engine) landPulls(now time.Time) {
	if len(e.pulls) == 0 {
		return
	}
	e.pulls = slices.DeleteFunc(e.pulls, func(s *seq) bool {
		if s.pullReady.After(now) {
			return false
		}
		s.computed = s.pullTokens
		e.commitBlocks(s)
		s.pull = pullDone
		s.state = stateWaiting
		heap.Push(&e.waiting, s)
		e.landed++
		e.st.Transfers++
		e.st.TransferredTokens += uint64(s.transferred)
		return true
	})
	e.st.Transferring = len(e.pulls)
}

// nextPull is when the earliest transfer in flight lands (zero: none).
func (e *Engine) nextPull() time.Time {
	var t time.Time
	for _, s := range e.pulls {
		if t.IsZero() || s.pullReady.Before(t) {
			t = s.pullReady
		}
	}
	return t
}

// dropPull removes a cancelled or aborted s from the transfers in flight.
func (e *Engine) dropPull(s *seq) {
	if i := slices.Index(e.pulls, s); i >= 0 {
		e.pulls = slices.Delete(e.pulls, i, i+1)
	}
	e.st.Transferring = len(e.pulls)
	e.pool.releaseAll(s.blocks)
	s.blocks = s.blocks[:0]
}

// unlandStuck breaks the one deadlock landed transfers can cause: nothing
// runs, so nothing frees blocks, while waiting requests hold the blocks of
// their landed transfers and the queue's head cannot get any. It then
// releases those blocks (their committed content stays cached, so the
// requests hit it when admitted again, as after a preemption) and reports
// whether it did.
func (e *Engine) unlandStuck() bool {
	if e.landed == 0 || len(e.running) > 0 {
		return false
	}
	for _, s := range e.waiting {
		if len(s.blocks) > 0 {
			e.pool.releaseAll(s.blocks)
			s.blocks = s.blocks[:0]
			s.computed, s.nCommitted = 0, 0
			e.st.Preemptions++
		}
	}
	e.landed = 0
	return true
}
