package scheduler

import "math"

// Herding: several replicas deciding at the same moment on the same
// gossiped view all see the same cheapest worker, and none of them sees
// the others' bookings until the next gossip round. A burst of new
// conversations entering through several owners at one instant then lands
// on one worker, whose pool overflows (docs/benchmarks.md §2 and §7).
//
// The Core cannot see those bookings, but it can count them afterwards:
// the remote bookings that show up in its view within HerdWindow after one
// of its own decisions were made on views that did not hold that decision,
// and its decision on a view that did not hold them. Their smoothed count
// per decision is how many bookings a decision must expect to be blind to
// (0 with one replica, near 0 when arrivals are spread, several per
// decision under bursts). Each of them adds about a mean request's prefill
// work to some worker, so costs closer than that product cannot be told
// apart: the TTFT selector adds to the cost of every worker holding no more
// of the prompt than the common prefix (herdCommon: a depth held by at
// least as many workers as there are decisions blind to each other) a
// rendezvous draw in [0, band) keyed by the request's first uncached block
// and the worker. Different requests
// then spread over the workers within the band, the same on every replica,
// and the same request ranks the workers the same from any replica; a
// request cached deeper somewhere keeps that worker's exact cost (a draw
// only ever raises a cost). With one replica there is nothing to count and
// the decisions are those without the band; with arrivals that do not
// coincide the band is near zero.

// herdState is the Core's count of remote bookings it could not see and,
// during a selection, the band and the request's rendezvous key.
type herdState struct {
	seen  uint64     // remote bookings observed (rises of remote active requests)
	marks []herdMark // this Core's decisions whose window is open, oldest first
	head  int
	est   float64 // smoothed unseen remote bookings per decision
	n     int     // decisions folded into est, up to herdSmoothing

	band   float64 // this selection's band (ms), 0 when off
	key    uint64  // this selection's rendezvous key
	common int     // this selection's prefix too widely held to tell workers apart, in blocks
	depths []int32 // scratch: the reporting workers' overlaps
	top    []int32 // scratch: herdCommon's deepest overlaps
}

// herdMark is one decision: when, and how many remote bookings had been
// observed by then.
type herdMark struct {
	at   int64
	seen uint64
}

// herdSmoothing is how many decisions the estimate is smoothed over.
const herdSmoothing = 32

// herdMaxOpen bounds the open decisions: beyond it the oldest is folded
// early (a Core deciding thousands of times per window loses nothing by
// sampling).
const herdMaxOpen = 1024

// herdOn reports whether the herd band is in use: the TTFT selector with a
// gain above zero and other replicas' load to learn from.
func (c *Core) herdOn() bool {
	return c.cfg.Selector == SelectorTTFT && c.cfg.TTFT.Herd > 0 && c.load != nil
}

// herdClose folds every decision whose window ended before now.
func (c *Core) herdClose(now int64) {
	h := &c.herd
	w := int64(c.cfg.TTFT.HerdWindow * 1e6)
	for h.head < len(h.marks) && (h.marks[h.head].at+w < now || len(h.marks)-h.head > herdMaxOpen) {
		h.fold(float64(h.seen - h.marks[h.head].seen))
		h.head++
	}
	if h.head == len(h.marks) {
		h.marks, h.head = h.marks[:0], 0
	} else if h.head > 64 && 2*h.head > len(h.marks) {
		n := copy(h.marks, h.marks[h.head:])
		h.marks, h.head = h.marks[:n], 0
	}
}

func (h *herdState) fold(k float64) {
	if h.n < herdSmoothing {
		h.n++
		h.est += (k - h.est) / float64(h.n)
		return
	}
	h.est += (k - h.est) / herdSmoothing
}

// herdDecided opens the window of a decision made now.
func (c *Core) herdDecided(now int64) {
	if !c.herdOn() {
		return
	}
	c.herdClose(now)
	c.herd.marks = append(c.herd.marks, herdMark{at: now, seen: c.herd.seen})
}

// herdBegin sets the band, key and common prefix of a selection of r.
// c.ovl and c.touched hold r's overlaps.
func (c *Core) herdBegin(r *Request) {
	h := &c.herd
	h.band = 0
	if !c.herdOn() || h.est <= 0 {
		return
	}
	h.band = c.cfg.TTFT.Herd * h.est * c.ttft.work
	// A prefix held by at least as many workers as there are decisions
	// blind to each other (a shared system prompt, on part of a large
	// fleet or on all of a small one) tells the workers apart no more
	// than none:
	// its holders draw like the rest, and only the fewer workers holding
	// more of the prompt keep their exact costs. The first block past the
	// deepest report is the request's own.
	deepest := 0
	h.depths = h.depths[:0]
	c.stamp++
	for _, i := range c.touched {
		deepest = max(deepest, int(c.ovl[i]))
		if c.allow[i] != c.stamp {
			c.allow[i] = c.stamp
			h.depths = append(h.depths, c.ovl[i])
		}
	}
	h.common, h.top = herdCommon(h.depths, len(c.workers), h.est, h.top)
	if n := len(r.BlockHashes); n > 0 {
		h.key = mix64(r.BlockHashes[herdKeyBlock(r.BlockHashes, deepest, c.cfg.IndexKeeps)])
	} else {
		h.key = hashString(r.ID)
	}
}

// herdKeyBlock is the position of the block that keys a request's
// rendezvous draw: the first block at or past deepest (the deepest
// reported overlap) that the index keeps, or the prompt's last block when
// it keeps none of them. keeps nil keeps every block: deepest itself.
//
// The key must be the request's own: requests sharing it rank the workers
// the same on every replica, which keeps the cold requests of one new
// prefix together and sends them all to one worker. A sampled index
// reports depths only at the positions it keeps, so a prefix every request
// shares (Mooncake's first 512 tokens, a system prompt) is reported short
// of its end; keyed by the block after that report, every new conversation
// shared one key, and every owner sent its share of a burst to the same
// worker until gossip showed the pile (docs/benchmarks.md §10). The first
// kept block past the report is one no worker holds as far as the index
// can tell: requests sharing it share an uncached prefix at the index's
// resolution, as the block after the report does at full resolution.
func herdKeyBlock(hashes []uint64, deepest int, keeps func(uint64) bool) int {
	k := min(max(deepest, 0), len(hashes)-1)
	if keeps == nil {
		return k
	}
	for k < len(hashes)-1 && !keeps(hashes[k]) {
		k++
	}
	return k
}

// herdCommon is the depth, in blocks, up to which a prefix does not tell
// workers apart: the depth that at least fanout workers hold, fanout being
// the decision and the est others blind to it (rounded up), or, when every
// one of the n registered workers reports a prefix, the shallowest of them.
// depths are the distinct reporting workers' overlaps; top is scratch for
// the fanout deepest (O(len(depths) × fanout) at worst, O(len(depths))
// when most holders hold the same prefix, as a system prompt's do).
func herdCommon(depths []int32, n int, est float64, top []int32) (int, []int32) {
	if len(depths) == 0 {
		return 0, top
	}
	fanout := 1 + int(math.Ceil(est))
	top = top[:0]
	least := depths[0]
	for _, d := range depths {
		least = min(least, d)
		if len(top) == fanout {
			if d <= top[0] {
				continue
			}
			copy(top, top[1:]) // drop the shallowest of the deepest fanout
			top = top[:fanout-1]
		}
		// Keep top ascending.
		j := len(top)
		top = append(top, d)
		for ; j > 0 && top[j-1] > d; j-- {
			top[j] = top[j-1]
		}
		top[j] = d
	}
	common := 0
	if len(depths) >= n {
		common = int(least)
	}
	if len(top) == fanout {
		common = max(common, int(top[0]))
	}
	return common, top
}

// herdDraws reports whether a worker with ovl blocks of the request's
// prefix takes a draw: only those holding no more than the common prefix
// (herdCommon). A request with a deeper prefix on fewer workers is placed
// by its cache, and a draw would only pull it away from it; the new
// conversations, which the cost cannot place by cache, are the ones that
// herd.
func (c *Core) herdDraws(ovl int) bool {
	return c.herd.band > 0 && ovl <= c.herd.common
}

// herdShallow reports whether worker s, holding ovl blocks of the prompt,
// more than the common prefix, holds too little past it to keep its exact
// cost. Every drawing worker's cost is raised by its draw, the least of
// which is about band ÷ (workers + 1): that is the edge a holder's
// exemption gives it. A holder whose cache past the common prefix saves
// less prefill than that edge wins by the exemption alone, and on every
// replica alike: the replicas blind to each other all choose it (at
// 10,000 workers, the few holders of one user population's first block).
// Such a holder draws like the rest. In a fleet not much larger than the
// decisions blind to each other (workers <= 2 × fanout) the edge is most
// of the band, and the exemption is what keeps a conversation at its
// cache (docs/benchmarks.md §7's 8 workers): there it stays.
func (c *Core) herdShallow(s *workerSlot, ovl int) bool {
	h := &c.herd
	n := float64(len(c.workers))
	if h.band <= 0 || ovl <= h.common || n <= 2*(1+math.Ceil(h.est)) {
		return false
	}
	saves := c.cfg.TTFT.Prefill[1] * float64((ovl-h.common)*int(s.blockSize))
	return saves < h.band/(n+1)
}

// herdOffset is worker s's draw for this selection, in [0, band).
func (c *Core) herdOffset(s *workerSlot) float64 {
	return c.herd.band * (float64(c.herdRank(s)) / (1 << 53))
}

// herdRank is the integer form of worker s's draw, in [0, 2^53): the draws
// of two workers compare as their ranks do (bucketRepHerd compares ranks).
func (c *Core) herdRank(s *workerSlot) uint64 {
	return mix64(c.herd.key^s.idHash) >> 11
}

// mix64 is a 64-bit finalizer (splitmix64's).
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// hashString is FNV-1a of s, finalized.
func hashString(s string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 0x100000001b3
	}
	return mix64(h)
}
