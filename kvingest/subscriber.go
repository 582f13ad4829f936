package kvingest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// maxDumpBlocks bounds the hashes collected from one dump, whatever the
// chunks claim, so a broken worker cannot exhaust the router's memory.
const maxDumpBlocks = 1 << 22

// Subscriber feeds an Index from NATS: it subscribes to every worker's KV
// event subject, decodes and applies batches, and repairs workers the index
// reset by fetching their dumps (request-reply, chunked).
//
// Goroutines: Run owns all of them: a reader pulling from the subscription,
// ApplyShards appliers (a worker's batches always go to the same one, so
// they stay in order), the repair loop and the prediction sweep loop.
type Subscriber struct {
	cfg    Config
	nc     *nats.Conn
	ix     *kvindex.Index
	subj   wire.Subjects
	log    *zap.Logger
	m      *subscriberMetrics
	clock  clock.Clock
	filter func(*nats.Msg) bool
	// sampleWarned holds the workers whose sampling mismatch was logged.
	sampleWarned sync.Map
}

// SubscriberOption customises a Subscriber.
type SubscriberOption func(*Subscriber)

// WithMessageFilter drops every KV batch message for which keep returns
// false, as if NATS had lost it (counted). It exists for fault-injection
// tests of gap repair; dump replies are never filtered.
func WithMessageFilter(keep func(*nats.Msg) bool) SubscriberOption {
	return func(s *Subscriber) { s.filter = keep }
}

// WithClock sets the clock of the sweep and retry loops and of lag
// measurement (default: the wall clock).
func WithClock(c clock.Clock) SubscriberOption {
	return func(s *Subscriber) { s.clock = c }
}

// NewSubscriber returns a subscriber feeding ix from nc. It starts nothing.
func NewSubscriber(cfg Config, nc *nats.Conn, ix *kvindex.Index, log *zap.Logger, reg prometheus.Registerer, opts ...SubscriberOption) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if nc == nil || ix == nil {
		return nil, errors.New("kvingest: subscriber needs a NATS connection and an index")
	}
	if log == nil {
		log = zap.NewNop()
	}
	s := &Subscriber{
		cfg:   cfg,
		nc:    nc,
		ix:    ix,
		subj:  wire.NewSubjects(cfg.Cluster),
		log:   log.Named("kvindex_subscriber"),
		m:     newSubscriberMetrics(reg),
		clock: clock.Real{},
	}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Run subscribes and processes until ctx ends, then unsubscribes and returns
// after every goroutine it started has exited. It returns nil on
// cancellation and an error if it cannot subscribe or the connection closes.
func (s *Subscriber) Run(ctx context.Context) error {
	sub, err := s.nc.SubscribeSync(s.subj.KVAll())
	if err != nil {
		return fmt.Errorf("kvingest: subscribe %s: %w", s.subj.KVAll(), err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.SetPendingLimits(s.cfg.PendingMsgs, -1); err != nil {
		return fmt.Errorf("kvingest: pending limits: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	shards := make([]chan *nats.Msg, s.cfg.ApplyShards)
	for i := range shards {
		ch := make(chan *nats.Msg, shardQueue)
		shards[i] = ch
		wg.Go(func() {
			var dec wire.KVBatchDecoder // this shard's: decoding reuses its memory
			for m := range ch {
				s.handle(m, &dec)
			}
		})
	}
	wg.Go(func() { s.repairLoop(ctx) })
	wg.Go(func() { s.sweepLoop(ctx) })

	err = s.readLoop(ctx, sub, shards)
	cancel()
	for _, ch := range shards {
		close(ch)
	}
	wg.Wait()
	return err
}

func (s *Subscriber) readLoop(ctx context.Context, sub *nats.Subscription, shards []chan *nats.Msg) error {
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if ctx.Err() != nil {
			return nil //nolint:nilerr // the read ends because its context did: a normal stop
		}
		switch {
		case errors.Is(err, nats.ErrSlowConsumer):
			// NATS dropped messages; the gaps they leave are repaired.
			s.log.Warn("kv subscription is a slow consumer, messages dropped")
			continue
		case err != nil:
			return fmt.Errorf("kvingest: kv subscription: %w", err)
		}
		ch := shards[shardOfWorker(wire.WorkerFromSubject(m.Subject), len(shards))]
		select {
		case ch <- m:
		case <-ctx.Done():
			return nil
		}
	}
}

func shardOfWorker(worker string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(worker))
	return int(h.Sum32() % uint32(n))
}

func (s *Subscriber) handle(m *nats.Msg, dec *wire.KVBatchDecoder) {
	if s.filter != nil && !s.filter(m) {
		s.m.filtered.Inc()
		return
	}
	b, err := dec.Decode(m.Data)
	if err == nil && wire.WorkerFromSubject(m.Subject) != b.Worker {
		err = fmt.Errorf("%w: batch of %s on subject %s", wire.ErrMalformed, b.Worker, m.Subject)
	}
	if err != nil {
		s.m.decodeBatch.Inc()
		s.log.Warn("dropping undecodable kv batch", zap.String("subject", m.Subject), zap.Error(err))
		return
	}
	if b.TimeUnixNano > 0 {
		if lag := s.clock.Now().UnixNano() - b.TimeUnixNano; lag >= 0 {
			s.m.lag.Observe(float64(lag) / 1e9)
		}
	}
	if b.Sample > s.ix.Sample() {
		// The publisher dropped hashes this index would keep: its lookups
		// of this worker see only the publisher's rate (the hashes the
		// index samples at its own rate are a subset of the publisher's
		// exactly when the index's rate is at least as high). Applied
		// anyway, it is still the best knowledge there is; counted so that
		// the misconfiguration shows.
		s.m.sampleMismatch.Inc()
		s.warnSampleOnce(b.Worker, b.Sample)
	}
	out, err := s.ix.ApplyBatch(b)
	if err != nil {
		s.log.Warn("kv batch not applied", zap.String("worker", b.Worker), zap.Error(err))
	}
	if out == kvindex.OutcomeBuffered || out == kvindex.OutcomeResync {
		dec.Take() // the index keeps the batch for its replay
	}
}

// warnSampleOnce logs a worker's sampling rate above the index's once per
// worker.
func (s *Subscriber) warnSampleOnce(worker string, sample int) {
	if _, seen := s.sampleWarned.LoadOrStore(worker, struct{}{}); seen {
		return
	}
	s.log.Warn("kv events sampled more coarsely than this index: set -kv-sample on the adapter at most -index.sample",
		zap.String("worker", worker), zap.Int("adapter_sample", sample), zap.Int("index_sample", s.ix.Sample()))
}

type retry struct {
	next  time.Time
	delay time.Duration
}

// repairLoop fetches a dump for every worker the index reset, retrying
// failures with exponential backoff. Dumps run one at a time: a repair storm
// (say, after a NATS reconnect) then costs routers one dump stream each.
func (s *Subscriber) repairLoop(ctx context.Context) {
	retries := make(map[string]retry)
	var names []string
	for {
		var wait <-chan time.Time
		if len(retries) > 0 {
			now := s.clock.Now()
			first := time.Duration(-1)
			for _, r := range retries {
				if d := r.next.Sub(now); first < 0 || d < first {
					first = max(d, 0)
				}
			}
			wait = s.clock.After(first)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.ix.ResyncNotify():
		case <-wait:
		}
		// One scan drops the hidden entries of every worker reset since
		// the last pass, however many there are.
		s.ix.ClearStale()
		names = s.ix.NeedingDump(names[:0])
		live := make(map[string]bool, len(names))
		for _, w := range names {
			live[w] = true
			if r, ok := retries[w]; ok && s.clock.Now().Before(r.next) {
				continue
			}
			if ctx.Err() != nil {
				return
			}
			if err := s.repair(ctx, w); err != nil {
				r := retries[w]
				r.delay = min(max(2*r.delay, s.cfg.DumpRetry), s.cfg.DumpRetryMax)
				r.next = s.clock.Now().Add(r.delay)
				retries[w] = r
				s.log.Warn("kv dump failed", zap.String("worker", w), zap.Duration("retry_in", r.delay), zap.Error(err))
				continue
			}
			delete(retries, w)
		}
		for w := range retries {
			if !live[w] {
				delete(retries, w)
			}
		}
	}
}

// repair fetches worker's dump and applies it.
func (s *Subscriber) repair(ctx context.Context, worker string) error {
	d, err := s.FetchDump(ctx, worker)
	if err != nil {
		switch {
		case errors.Is(err, ErrNoResponders):
			s.m.dumps.WithLabelValues("no_responders").Inc()
		case errors.Is(err, context.DeadlineExceeded):
			s.m.dumps.WithLabelValues("timeout").Inc()
		case errors.Is(err, wire.ErrMalformed), errors.Is(err, wire.ErrVersion):
			s.m.dumps.WithLabelValues("malformed").Inc()
		default:
			s.m.dumps.WithLabelValues("error").Inc()
		}
		return err
	}
	o := s.ix.ApplyDump(d)
	s.m.dumps.WithLabelValues(o.String()).Inc()
	s.log.Info("kv dump applied", zap.String("worker", worker), zap.Uint64("instance", d.Instance),
		zap.Uint64("as_of_id", d.AsOfID), zap.Int("blocks", len(d.Hashes)), zap.Stringer("outcome", o))
	return nil
}

// FetchDump asks worker for its full block set and collects the chunked
// reply. Errors wrap ErrDumpFailed, and ErrNoResponders, wire.ErrMalformed
// or context.DeadlineExceeded where they apply.
func (s *Subscriber) FetchDump(ctx context.Context, worker string) (*kvindex.Dump, error) {
	inbox := nats.NewInbox()
	sub, err := s.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: subscribe reply inbox: %w", ErrDumpFailed, worker, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	req := nats.NewMsg(s.subj.KVDump(worker))
	req.Reply = inbox
	req.Data = wire.EncodeKVDumpRequest(&wire.KVDumpRequest{MaxBlocksPerChunk: s.cfg.DumpChunkBlocks})
	if err := s.nc.PublishMsg(req); err != nil {
		return nil, fmt.Errorf("%w: %s: publish request: %w", ErrDumpFailed, worker, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DumpTimeout)
	defer cancel()
	d := &kvindex.Dump{Worker: worker}
	for seq := uint32(0); ; seq++ {
		m, err := sub.NextMsgWithContext(ctx)
		if errors.Is(err, nats.ErrNoResponders) {
			// The server answered the request's inbox with status 503.
			return nil, fmt.Errorf("%w: %s: %w", ErrDumpFailed, worker, ErrNoResponders)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: waiting for chunk %d: %w", ErrDumpFailed, worker, seq, err)
		}
		c, err := wire.DecodeKVDumpChunk(m.Data)
		if err != nil {
			s.m.decodeChunk.Inc()
			return nil, fmt.Errorf("%w: %s: chunk %d: %w", ErrDumpFailed, worker, seq, err)
		}
		switch {
		case c.Worker != worker:
			err = fmt.Errorf("chunk from %s", c.Worker)
		case c.Seq != seq:
			err = fmt.Errorf("chunk %d, want %d", c.Seq, seq)
		case seq > 0 && (c.Instance != d.Instance || c.AsOfID != d.AsOfID):
			err = fmt.Errorf("chunk %d changes instance or as_of_id", seq)
		case len(d.Hashes)+len(c.Hashes) > maxDumpBlocks:
			err = fmt.Errorf("more than %d blocks", maxDumpBlocks)
		}
		if err != nil {
			s.m.decodeChunk.Inc()
			return nil, fmt.Errorf("%w: %s: %w: %w", ErrDumpFailed, worker, wire.ErrMalformed, err)
		}
		d.Instance, d.AsOfID = c.Instance, c.AsOfID
		d.Hashes = append(d.Hashes, c.Hashes...)
		if c.Final {
			return d, nil
		}
	}
}

func (s *Subscriber) sweepLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(s.cfg.SweepInterval):
			s.ix.SweepPredictions()
		}
	}
}

// shardQueue is how many messages the reader may hand an apply shard ahead
// of it. NATS's pending queue stays the buffer that counts (its limit makes
// the subscription a slow consumer); a short queue here only lets the reader
// and the shards run without a hand-off per message.
const shardQueue = 64
