package scheduler

// workerLedger is the load this Core has booked on one worker.
type workerLedger struct {
	// Field order keeps everything the selector reads in the first cache line.
	active  int
	prefill int
	private int       // unshared blocks: partial tails and expected output
	refs    blockRefs // prompt block hash → bookings holding it
	slot    int32     // the worker's index in Core.workers, -1 unregistered
	// ttftSlow is the worker's calibrated TTFT scale minus one (so the zero
	// value is the reference speed) and ttftOverhead the fixed part of its
	// observed grant-to-first-token times, in ms; cal is the fit they come
	// from (selector_ttft.go, calibrate).
	ttftSlow     float64
	ttftOverhead float64
	cal          calibrationFit
}

func (l *workerLedger) load() WorkerLoad {
	return WorkerLoad{ActiveRequests: l.active, PrefillTokens: l.prefill, DecodeBlocks: l.refs.count() + l.private}
}

func (l *workerLedger) empty() bool { return l.active == 0 }

// activeDepth is how many leading blocks of hashes are already held by
// active bookings. Sequence hashes are prefix-closed (a booking holding block
// i holds blocks 0..i-1 too), so a binary search over the prefix suffices.
func (l *workerLedger) activeDepth(hashes []uint64) int {
	if l.refs.count() == 0 || len(hashes) == 0 || !l.refs.has(hashes[0]) {
		return 0
	}
	lo, hi := 1, len(hashes) // hashes[:lo] held; answer in [lo, hi]
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1)
		if l.refs.has(hashes[mid-1]) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// booking is one admitted request's load on one worker.
type booking struct {
	id        BookingID
	requestID string
	class     string
	worker    string
	ledger    *workerLedger
	hashes    []uint64
	prompt    int
	cached    int
	// tierCredit is the prompt's lower-tier tokens (beyond cached) not
	// booked as prefill: those loaded back less their load cost.
	tierCredit int
	output     int
	seqs       int // sequences (0 counts as 1): what the booking adds to active
	private    int
	prefill    int // uncached prompt tokens until the first token
	attempt    int // the granted attempt (Request.Attempt); adopted bookings: 0
	acked      bool
	deadline   int64 // Unix ns: ack deadline until acked, then renewal expiry
	ei         int   // position in the expiry heap
	// For the TTFT selector's calibration: when the grant was made (Unix
	// ns; 0 for adopted bookings) and the reference-ms TTFT predicted then.
	grantedAt int64
	predMs    float64
	// tenants.go: the tenant holding a concurrency slot with this booking
	// (nil: none) and the tokens charged to its bucket at booking
	tenant   *tenantState
	estimate int64
	// disagg.go: the other booking of a prefill/decode pair (nil: none);
	// decodeSide marks the decode worker's.
	pair       *booking
	decodeSide bool
}

func (b *booking) tenantID() string {
	if b.tenant == nil {
		return ""
	}
	return b.tenant.id
}

func (l *workerLedger) add(b *booking) {
	l.active += max(1, b.seqs)
	l.prefill += b.prefill
	l.private += b.private
	for _, h := range b.hashes {
		l.refs.inc(h)
	}
}

func (l *workerLedger) remove(b *booking) {
	l.active -= max(1, b.seqs)
	l.prefill -= b.prefill
	l.private -= b.private
	if l.active == 0 && len(l.refs.keys) <= 16*len(b.hashes) {
		// The last booking leaves: every count drops to zero, and clearing
		// the table is cheaper than deleting its keys one by one.
		l.refs.reset()
		return
	}
	for _, h := range b.hashes {
		l.refs.dec(h)
	}
}

// expiryHeap orders bookings by deadline (indexed, so acknowledging or
// renewing a booking moves it in place and NextWake is exact).
type expiryHeap = indexedHeap[*booking, byDeadline]

type byDeadline struct{}

func (byDeadline) less(a, b *booking) bool {
	if a.deadline != b.deadline {
		return a.deadline < b.deadline
	}
	return a.id < b.id
}
func (byDeadline) setPos(b *booking, i int) { b.ei = i }
