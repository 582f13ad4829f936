package enginekv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"
)

// SubscriberConfig configures a Subscriber. Defaults live in
// DefaultSubscriberConfig.
type SubscriberConfig struct {
	// Endpoint is the engine's PUB endpoint, tcp://host:port. The
	// subscriber connects to it, or binds it when Bind is set (for
	// publishers that connect out, as vLLM does when its endpoint has no
	// wildcard).
	Endpoint string
	Bind     bool
	// ReplayEndpoint is the engine's replay ROUTER, tcp://host:port; empty
	// disables replay (every gap is then a reset).
	ReplayEndpoint string
	// Topic filters the stream by prefix; empty takes every topic.
	Topic string
	// ReplayTimeout bounds one replay from dial to end marker.
	ReplayTimeout time.Duration
	// MaxBufferedBatches bounds the live batches held while a replay runs
	// and the batches one replay may return; beyond it the replay is given
	// up and the subscriber resets.
	MaxBufferedBatches int
	// LogInterval rate-limits warnings about corrupt frames: one per reason
	// per interval, the rest at debug level.
	LogInterval time.Duration
}

// DefaultSubscriberConfig returns the defaults: a 2 s replay timeout and
// 20,000 buffered batches (twice vLLM's default replay buffer of 10,000).
func DefaultSubscriberConfig() SubscriberConfig {
	return SubscriberConfig{
		ReplayTimeout:      2 * time.Second,
		MaxBufferedBatches: 20000,
		LogInterval:        10 * time.Second,
	}
}

// Validate names the first bad field.
func (c *SubscriberConfig) Validate() error {
	switch {
	case !validTCP(c.Endpoint):
		return fmt.Errorf("%w: SubscriberConfig.Endpoint %q must be tcp://host:port", ErrConfig, c.Endpoint)
	case c.ReplayEndpoint != "" && !validTCP(c.ReplayEndpoint):
		return fmt.Errorf("%w: SubscriberConfig.ReplayEndpoint %q must be tcp://host:port", ErrConfig, c.ReplayEndpoint)
	case c.ReplayTimeout <= 0:
		return fmt.Errorf("%w: SubscriberConfig.ReplayTimeout %v must be positive", ErrConfig, c.ReplayTimeout)
	case c.MaxBufferedBatches <= 0:
		return fmt.Errorf("%w: SubscriberConfig.MaxBufferedBatches %d must be positive", ErrConfig, c.MaxBufferedBatches)
	case c.LogInterval < 0:
		return fmt.Errorf("%w: SubscriberConfig.LogInterval %v must not be negative", ErrConfig, c.LogInterval)
	}
	return nil
}

func validTCP(ep string) bool {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return false
	}
	i := strings.LastIndexByte(rest, ':')
	return i > 0 && i < len(rest)-1
}

// ResetReason says why a Subscriber lost continuity.
type ResetReason uint8

// Reset reasons; String values are the `reason` label of the resets metric.
const (
	// ResetRestart: the sequence went back (the engine restarted).
	ResetRestart ResetReason = iota + 1
	// ResetGap: batches were lost and no replay endpoint is configured.
	ResetGap
	// ResetReplayFailed: the replay request failed or timed out.
	ResetReplayFailed
	// ResetReplayIncomplete: the replay could not fill the gap (the
	// engine's buffer no longer held the batches, or held corrupt ones).
	ResetReplayIncomplete
	// ResetJoinedMidStream: the first batch seen was not the engine's first
	// and the batches before it could not be replayed.
	ResetJoinedMidStream
	// ResetOverflow: more batches arrived during a replay than
	// MaxBufferedBatches.
	ResetOverflow
)

func (r ResetReason) String() string {
	switch r {
	case ResetRestart:
		return "restart"
	case ResetGap:
		return "gap"
	case ResetReplayFailed:
		return "replay_failed"
	case ResetReplayIncomplete:
		return "replay_incomplete"
	case ResetJoinedMidStream:
		return "joined_mid_stream"
	case ResetOverflow:
		return "overflow"
	}
	return fmt.Sprintf("ResetReason(%d)", uint8(r))
}

// Handler receives a Subscriber's output. Both methods are called from the
// Subscriber's Run goroutine only, one call at a time; they may block (the
// subscriber then stops reading, and the engine's PUB socket drops for it
// at its high-water mark, which shows up as a gap).
type Handler interface {
	// Batch is called in sequence order, without gaps or duplicates since
	// the last Reset. b is the handler's to keep.
	Batch(b Batch)
	// Reset is called when continuity is lost; the batches after it start a
	// new run (the handler should treat its mirror of the engine as stale).
	Reset(reason ResetReason)
}

// A TransientHandler is a Handler that never keeps a batch, or anything in
// it, past its call. The Subscriber then decodes every payload into the
// same memory (a Decoder) and calls BatchTransient instead of Batch, so
// following the engine allocates nothing per batch. The adapter's mirror is
// one: it copies what it keeps.
type TransientHandler interface {
	Handler
	// BatchTransient is Batch for a batch that is valid only during the
	// call.
	BatchTransient(b *Batch)
}

// Subscriber follows one engine's KV event stream. See doc.go for its
// sequence rules and concurrency.
type Subscriber struct {
	cfg     SubscriberConfig
	h       Handler
	th      TransientHandler // h, when it is one
	dec     Decoder          // for th, owned by Run's goroutine
	log     *zap.Logger
	zlog    *log.Logger
	m       subMetrics
	lastLog map[string]time.Time

	// State of the Run goroutine.
	haveLive  bool
	lastLive  uint64 // last seq seen on the live stream
	haveSeq   bool
	expected  uint64 // next seq to deliver
	replaying bool
	replayGen uint64
	buffered  []rawBatch
	joinTried bool
	// After a reconnect the engine may have restarted and already passed
	// our sequence number: the first replay then starts at the last
	// delivered batch and compares it with the one we have.
	suspect     bool
	verifying   bool
	lastPayload []byte
	liveTopic   string // older replies carry no topic: replayed batches get the live one
}

type subMetrics struct {
	frames    *prometheus.CounterVec
	replays   *prometheus.CounterVec
	resets    *prometheus.CounterVec
	unknown   prometheus.Counter
	delivered prometheus.Counter
	events    prometheus.Counter
}

// NewSubscriber builds a Subscriber. It starts nothing: Run does.
func NewSubscriber(cfg SubscriberConfig, h Handler, logger *zap.Logger, reg prometheus.Registerer) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if h == nil {
		return nil, fmt.Errorf("%w: nil Handler", ErrConfig)
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	logger = logger.Named("enginekv_sub").With(zap.String("endpoint", cfg.Endpoint))
	f := promauto.With(reg)
	th, _ := h.(TransientHandler)
	s := &Subscriber{cfg: cfg, h: h, th: th, log: logger, lastLog: map[string]time.Time{},
		zlog: zap.NewStdLog(logger.Named("zmq4")),
		m: subMetrics{
			frames: f.NewCounterVec(prometheus.CounterOpts{Name: NameFrames,
				Help: "ZeroMQ messages received from the engine, by result."}, []string{"result"}),
			replays: f.NewCounterVec(prometheus.CounterOpts{Name: NameReplays,
				Help: "Replay requests to the engine, by result."}, []string{"result"}),
			resets: f.NewCounterVec(prometheus.CounterOpts{Name: NameResets,
				Help: "Times continuity with the engine's stream was lost, by reason."}, []string{"reason"}),
			unknown: f.NewCounter(prometheus.CounterOpts{Name: NameUnknownEvents,
				Help: "Engine events of an unknown type, skipped."}),
			delivered: f.NewCounter(prometheus.CounterOpts{Name: NameBatches,
				Help: "Engine event batches delivered in order."}),
			events: f.NewCounter(prometheus.CounterOpts{Name: NameEvents,
				Help: "Engine events delivered."}),
		}}
	for _, r := range []frameResult{frameOK, frameBadCount, frameBadSeq, frameBadPayload, frameDuplicate} {
		s.m.frames.WithLabelValues(r.String())
	}
	for _, r := range []ResetReason{ResetRestart, ResetGap, ResetReplayFailed, ResetReplayIncomplete, ResetJoinedMidStream, ResetOverflow} {
		s.m.resets.WithLabelValues(r.String())
	}
	for _, r := range []string{replayOK, replayFailed, replayIncomplete} {
		s.m.replays.WithLabelValues(r)
	}
	return s, nil
}

// Replay results (the `result` label of the replays metric).
const (
	replayOK         = "ok"
	replayFailed     = "failed"
	replayIncomplete = "incomplete"
)

// message is what the reader hands the loop: a message's frames, or the
// news that it reconnected.
type message struct {
	frames      [][]byte
	reconnected bool
}

type replayResult struct {
	gen     uint64
	start   uint64
	batches []rawBatch
	err     error
}

// Run connects (or binds), then follows the stream until ctx ends. It
// returns nil when ctx ends, or an error when the socket cannot be set up
// (a bind that fails). It returns only after its reader and any replay have
// exited.
func (s *Subscriber) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // before the wait: the reader and a replay end with ctx

	msgs := make(chan message)   // unbuffered: the reader waits for the loop
	fatal := make(chan error, 1) // size 1: the reader reports once and exits
	wg.Add(1)
	go func() { defer wg.Done(); s.read(ctx, msgs, fatal) }()

	replays := make(chan replayResult, 1) // size 1: a replay never waits to report
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-fatal:
			return err
		case m := <-msgs:
			if m.reconnected {
				s.reconnected(ctx, &wg, replays)
				continue
			}
			if rb, res := parseLive(m.frames); res != frameOK {
				s.corrupt(res, nil)
			} else {
				s.live(ctx, rb, &wg, replays)
			}
		case r := <-replays:
			s.replayDone(ctx, r, &wg, replays)
		}
	}
}

// read owns the SUB socket. A connecting subscriber makes a new socket and
// dials again whenever its connection breaks (an engine restart): zmq4's own
// automatic reconnect gives up for good when its redial reaches a listener
// that is closing, so it is not used.
func (s *Subscriber) read(ctx context.Context, msgs chan<- message, fatal chan<- error) {
	for n := 0; ctx.Err() == nil; n++ {
		sub := zmq4.NewSub(ctx, zmq4.WithLogger(s.zlog), zmq4.WithDialerMaxRetries(-1),
			zmq4.WithDialerRetry(100*time.Millisecond))
		if err := s.open(sub); err != nil {
			_ = sub.Close()
			if ctx.Err() != nil {
				return
			}
			if s.cfg.Bind {
				fatal <- err
				return
			}
			s.log.Debug("connect failed, retrying", zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		s.log.Info("subscribed", zap.Bool("bind", s.cfg.Bind), zap.String("topic", s.cfg.Topic))
		if n > 0 {
			select {
			case msgs <- message{reconnected: true}:
			case <-ctx.Done():
			}
		}
		s.receive(ctx, sub, msgs)
		_ = sub.Close()
	}
}

func (s *Subscriber) open(sub zmq4.Socket) error {
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return fmt.Errorf("enginekv: subscribe %q: %w", s.cfg.Topic, err)
	}
	if s.cfg.Bind {
		if err := sub.Listen(listenAddr(s.cfg.Endpoint)); err != nil {
			return fmt.Errorf("enginekv: bind %s: %w", s.cfg.Endpoint, err)
		}
		return nil
	}
	if err := sub.Dial(s.cfg.Endpoint); err != nil {
		return fmt.Errorf("enginekv: connect %s: %w", s.cfg.Endpoint, err)
	}
	return nil
}

// receive hands messages to the loop until ctx ends or, for a connecting
// subscriber, the connection breaks (zmq4 reports that once, as an error).
func (s *Subscriber) receive(ctx context.Context, sub zmq4.Socket, msgs chan<- message) {
	for {
		m, err := sub.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.Debug("connection to the engine broke", zap.Error(err))
			if !s.cfg.Bind {
				return
			}
			continue // a bound socket keeps its other publishers
		}
		select {
		case msgs <- message{frames: m.Frames}:
		case <-ctx.Done():
			return
		}
	}
}

// listenAddr turns vLLM's wildcard spelling tcp://*:port into one net.Listen
// accepts.
func listenAddr(ep string) string {
	return strings.Replace(ep, "tcp://*:", "tcp://0.0.0.0:", 1)
}

func (s *Subscriber) corrupt(res frameResult, err error) {
	s.m.frames.WithLabelValues(res.String()).Inc()
	key := res.String()
	now := time.Now()
	lvl := zap.DebugLevel
	if now.Sub(s.lastLog[key]) >= s.cfg.LogInterval {
		s.lastLog[key] = now
		lvl = zap.WarnLevel
	}
	s.log.Log(lvl, "dropped a corrupt message from the engine", zap.String("result", key), zap.Error(err))
}

func (s *Subscriber) reset(r ResetReason) {
	s.m.resets.WithLabelValues(r.String()).Inc()
	s.log.Info("lost continuity with the engine's stream", zap.Stringer("reason", r))
	s.h.Reset(r)
}

// reconnected handles a new connection to the engine's PUB socket: the same
// engine, or a restarted one? With a replay endpoint the engine is asked at
// once for the last batch we took: the same engine answers with it, a
// restarted one (an empty buffer, or another batch under that number) is a
// reset now. Waiting for the next live batch instead would leave the routers
// predicting the lost cache until the new engine got work, and under
// KV-aware routing an engine whose blocks the routers no longer see may get
// none for a long time. Without a replay endpoint the next batch tells (see
// live).
func (s *Subscriber) reconnected(ctx context.Context, wg *sync.WaitGroup, replays chan replayResult) {
	s.suspect = s.haveSeq
	if !s.suspect || s.replaying || s.cfg.ReplayEndpoint == "" || s.expected == 0 {
		return
	}
	s.suspect = false
	s.verifying = true
	s.buffered = s.buffered[:0]
	// The replay decides same engine or restart; a restarted engine's
	// first live batch is no second restart.
	s.haveLive = false
	s.startReplay(ctx, s.expected-1, wg, replays)
}

// live handles one well-formed message of the PUB stream.
func (s *Subscriber) live(ctx context.Context, rb rawBatch, wg *sync.WaitGroup, replays chan replayResult) {
	if s.haveLive && rb.seq == s.lastLive {
		s.m.frames.WithLabelValues(frameDuplicate.String()).Inc()
		return
	}
	if s.haveLive && rb.seq < s.lastLive {
		// The engine restarted: whatever replay was running is about the
		// old engine.
		s.replaying, s.verifying, s.suspect = false, false, false
		s.replayGen++
		s.buffered = nil
		s.haveSeq = false
		s.joinTried = false
		s.reset(ResetRestart)
	}
	s.haveLive, s.lastLive, s.liveTopic = true, rb.seq, rb.topic
	s.m.frames.WithLabelValues(frameOK.String()).Inc()
	if s.replaying {
		if len(s.buffered) >= s.cfg.MaxBufferedBatches {
			s.replaying, s.verifying = false, false
			s.replayGen++
			s.buffered = nil
			s.haveSeq = false
			s.joinTried = true // do not replay from 0 again for this engine
			s.reset(ResetOverflow)
			s.deliverFrom(rb)
			return
		}
		s.buffered = append(s.buffered, rb)
		return
	}
	if s.suspect && s.haveSeq && rb.seq >= s.expected && s.cfg.ReplayEndpoint != "" && s.expected > 0 {
		s.suspect = false
		s.verifying = true
		s.buffered = append(s.buffered[:0], rb)
		s.startReplay(ctx, s.expected-1, wg, replays)
		return
	}
	s.suspect = false
	switch {
	case !s.haveSeq && rb.seq == 0:
		s.deliverFrom(rb)
	case !s.haveSeq:
		if s.cfg.ReplayEndpoint != "" && !s.joinTried {
			s.joinTried = true
			s.buffered = append(s.buffered[:0], rb)
			s.startReplay(ctx, 0, wg, replays)
			return
		}
		s.reset(ResetJoinedMidStream)
		s.deliverFrom(rb)
	case rb.seq < s.expected:
		s.m.frames.WithLabelValues(frameDuplicate.String()).Inc()
	case rb.seq == s.expected:
		s.deliver(rb)
	default:
		if s.cfg.ReplayEndpoint != "" {
			s.buffered = append(s.buffered[:0], rb)
			s.startReplay(ctx, s.expected, wg, replays)
			return
		}
		s.reset(ResetGap)
		s.deliverFrom(rb)
	}
}

// deliverFrom starts a run at rb.
func (s *Subscriber) deliverFrom(rb rawBatch) {
	s.haveSeq, s.expected = true, rb.seq
	s.deliver(rb)
}

// deliver decodes and hands over the batch at s.expected. A payload that
// does not decode is a lost batch: the sequence still advances past it,
// after a reset.
func (s *Subscriber) deliver(rb rawBatch) {
	s.expected = rb.seq + 1
	s.lastPayload = rb.payload
	var b *Batch
	var err error
	if s.th != nil {
		b, err = s.dec.Decode(rb.payload)
	} else {
		var owned Batch
		owned, err = DecodeBatch(rb.payload)
		b = &owned
	}
	if err != nil {
		s.corrupt(frameBadPayload, err)
		s.reset(ResetGap)
		return
	}
	b.Topic, b.Seq = rb.topic, rb.seq
	if b.Unknown > 0 {
		s.m.unknown.Add(float64(b.Unknown))
	}
	s.m.delivered.Inc()
	s.m.events.Add(float64(len(b.Events)))
	if s.th != nil {
		s.th.BatchTransient(b)
		return
	}
	s.h.Batch(*b)
}

// startReplay replays from start; the live batches that triggered it are
// already in s.buffered.
func (s *Subscriber) startReplay(ctx context.Context, start uint64, wg *sync.WaitGroup, replays chan replayResult) {
	s.replaying = true
	s.replayGen++
	gen := s.replayGen
	s.log.Debug("replaying", zap.Uint64("from", start), zap.Int("buffered", len(s.buffered)))
	wg.Add(1)
	go func() {
		defer wg.Done()
		batches, err := s.replay(ctx, start)
		select {
		case replays <- replayResult{gen: gen, start: start, batches: batches, err: err}:
		case <-ctx.Done():
		}
	}()
}

// replay asks the engine's ROUTER for every buffered batch from start and
// collects the replies until the end marker.
func (s *Subscriber) replay(ctx context.Context, start uint64) ([]rawBatch, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithLogger(s.zlog), zmq4.WithDialerMaxRetries(-1),
		zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithTimeout(s.cfg.ReplayTimeout))
	defer d.Close()
	if err := d.Dial(s.cfg.ReplayEndpoint); err != nil {
		return nil, fmt.Errorf("dial %s: %w", s.cfg.ReplayEndpoint, err)
	}
	// vLLM's and SGLang's ROUTER expect [identity, empty, start]: a DEALER
	// adds no delimiter itself, so the empty frame is sent explicitly.
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, seqBytes(start))); err != nil {
		return nil, fmt.Errorf("send replay request: %w", err)
	}
	var out []rawBatch
	for {
		m, err := d.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("replay from %d: %w", start, ctx.Err())
			}
			return nil, fmt.Errorf("replay from %d: %w", start, err)
		}
		rb, res := parseReplay(m.Frames)
		switch res {
		case frameEnd:
			return out, nil
		case frameOK:
			if len(out) >= s.cfg.MaxBufferedBatches {
				return nil, fmt.Errorf("replay from %d: more than %d batches", start, s.cfg.MaxBufferedBatches)
			}
			if rb.seq >= start {
				out = append(out, rb)
			}
		default:
			s.corrupt(res, errors.New("in a replay reply"))
		}
	}
}

// replayDone merges a replay's batches with the live ones buffered
// meanwhile and delivers them in order.
func (s *Subscriber) replayDone(ctx context.Context, r replayResult, wg *sync.WaitGroup, replays chan replayResult) {
	if r.gen != s.replayGen || !s.replaying {
		return // superseded by a restart or an overflow
	}
	s.replaying = false
	if s.verifying && r.err == nil {
		s.verifying = false
		if len(r.batches) > 0 && r.batches[0].seq == r.start && bytes.Equal(r.batches[0].payload, s.lastPayload) {
			r.batches = r.batches[1:] // the same engine: go on from where we were
		} else {
			// Another engine behind the same endpoint, already past our
			// sequence number: start over and replay it from 0.
			s.haveSeq, s.joinTried = false, true
			s.reset(ResetRestart)
			s.startReplay(ctx, 0, wg, replays)
			return
		}
	}
	s.verifying = false
	buffered := s.buffered
	s.buffered = nil
	if r.err != nil {
		s.m.replays.WithLabelValues(replayFailed).Inc()
		s.log.Warn("replay failed", zap.Uint64("from", r.start), zap.Error(r.err))
		s.reset(ResetReplayFailed)
		s.haveSeq = false
		s.drain(buffered)
		return
	}
	complete := true
	for _, rb := range r.batches {
		if rb.topic == "" {
			rb.topic = s.liveTopic
		}
		complete = s.takeReplayed(rb, rb.seq == r.start) && complete
	}
	for _, rb := range buffered {
		// A buffered batch at the replay's start (the first batch of a
		// restarted engine, published while it was being asked) is no
		// join mid-stream.
		complete = s.takeReplayed(rb, rb.seq == r.start) && complete
	}
	if complete {
		s.m.replays.WithLabelValues(replayOK).Inc()
	} else {
		s.m.replays.WithLabelValues(replayIncomplete).Inc()
	}
}

// takeReplayed delivers rb, replayed or buffered during the replay, and
// reports false where something is missing. Before the first delivery a
// batch other than the replay's start means we joined
// mid-stream; after it, take checks the sequence.
func (s *Subscriber) takeReplayed(rb rawBatch, atStart bool) bool {
	if s.haveSeq {
		return s.take(rb)
	}
	if !atStart {
		s.reset(ResetJoinedMidStream)
	}
	s.deliverFrom(rb)
	return atStart
}

// take delivers rb after a replay: duplicates are dropped and a gap that
// the replay did not fill is a reset (no second replay for it). It reports
// false for a gap.
func (s *Subscriber) take(rb rawBatch) bool {
	switch {
	case rb.seq < s.expected:
		return true
	case rb.seq == s.expected:
		s.deliver(rb)
		return true
	}
	s.reset(ResetReplayIncomplete)
	s.deliverFrom(rb)
	return false
}

// drain delivers buffered live batches after a failed replay.
func (s *Subscriber) drain(buffered []rawBatch) {
	for _, rb := range buffered {
		if !s.haveSeq {
			s.deliverFrom(rb)
			continue
		}
		if rb.seq > s.expected {
			s.reset(ResetGap)
			s.deliverFrom(rb)
			continue
		}
		s.take(rb)
	}
}
