package enginekv

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"
)

// PublisherConfig configures a Publisher: what vLLM's ZmqEventPublisher
// does, with the encodings of the engine versions in doc.go.
type PublisherConfig struct {
	// Endpoint is bound for the PUB socket (tcp://host:port, port 0 picks
	// one, tcp://*:port binds every interface), or dialled when Dial is set
	// (for a subscriber that binds).
	Endpoint string
	Dial     bool
	// ReplayEndpoint is bound for the replay ROUTER; empty disables replay.
	ReplayEndpoint string
	// Topic is the first frame of every message.
	Topic string
	// Encoding is the payload layout and hash form.
	Encoding Encoding
	// ReplyWithTopic makes replay replies [topic, seq, payload] (vLLM since
	// replies carry the topic) instead of [seq, payload] (older vLLM,
	// SGLang).
	ReplyWithTopic bool
	// BufferSteps is how many recent batches the replay serves (vLLM's
	// buffer_steps, default 10,000).
	BufferSteps int
	// MaxQueue bounds the batches waiting to be sent (vLLM's
	// max_queue_size, default 100,000). Publish drops beyond it, counted.
	MaxQueue int
	// DPRank is written in every batch (vLLM stamps its data-parallel rank);
	// -1 writes none.
	DPRank int
}

// DefaultPublisherConfig returns vLLM's defaults.
func DefaultPublisherConfig() PublisherConfig {
	return PublisherConfig{
		Endpoint:       "tcp://127.0.0.1:5557",
		Encoding:       Encoding{Layout: LayoutArray, Hashes: HashUint},
		ReplyWithTopic: true,
		BufferSteps:    10000,
		MaxQueue:       100000,
	}
}

// Validate names the first bad field.
func (c *PublisherConfig) Validate() error {
	switch {
	case !validTCP(c.Endpoint):
		return fmt.Errorf("%w: PublisherConfig.Endpoint %q must be tcp://host:port", ErrConfig, c.Endpoint)
	case c.ReplayEndpoint != "" && !validTCP(c.ReplayEndpoint):
		return fmt.Errorf("%w: PublisherConfig.ReplayEndpoint %q must be tcp://host:port", ErrConfig, c.ReplayEndpoint)
	case c.BufferSteps <= 0:
		return fmt.Errorf("%w: PublisherConfig.BufferSteps %d must be positive", ErrConfig, c.BufferSteps)
	case c.MaxQueue <= 0:
		return fmt.Errorf("%w: PublisherConfig.MaxQueue %d must be positive", ErrConfig, c.MaxQueue)
	case c.DPRank < -1:
		return fmt.Errorf("%w: PublisherConfig.DPRank %d must be -1 or more", ErrConfig, c.DPRank)
	}
	if err := c.Encoding.Validate(); err != nil {
		return fmt.Errorf("PublisherConfig: %w", err)
	}
	return nil
}

// Publisher publishes KV event batches the way a vLLM-protocol engine does.
// Publish may be called from any goroutine (the simulated engine calls it
// with its lock held): it only queues. Run, on its own goroutine, numbers
// the batches from 0 in Publish order, encodes and sends them and keeps the
// last BufferSteps for replay; a second goroutine it owns answers replay
// requests.
type Publisher struct {
	cfg  PublisherConfig
	log  *zap.Logger
	zlog *log.Logger
	m    pubMetrics

	mu      sync.Mutex
	queue   []item
	wake    chan struct{} // size 1: Publish wakes Run
	ring    []entry       // replay buffer, oldest first once full
	ringPos int
	ringLen int

	ready          chan struct{}
	endpoint       string
	replayEndpoint string
	sock           zmq4.Socket           // the PUB socket while Run runs, under mu
	skipLive       func(seq uint64) bool // tests: drop a batch on the live stream only
}

type item struct {
	b   Batch
	raw [][]byte // tests: a raw message sent as is, unnumbered
}

type entry struct {
	seq     uint64
	payload []byte
}

type pubMetrics struct {
	batches prometheus.Counter
	dropped prometheus.Counter
	replays *prometheus.CounterVec
}

// NewPublisher builds a Publisher. It starts nothing and binds nothing: Run
// does.
func NewPublisher(cfg PublisherConfig, logger *zap.Logger, reg prometheus.Registerer) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	logger = logger.Named("enginekv_pub")
	f := promauto.With(reg)
	p := &Publisher{cfg: cfg, log: logger, zlog: zap.NewStdLog(logger.Named("zmq4")),
		wake: make(chan struct{}, 1), ready: make(chan struct{}),
		ring: make([]entry, cfg.BufferSteps),
		m: pubMetrics{
			batches: f.NewCounter(prometheus.CounterOpts{Name: NamePubBatches,
				Help: "KV event batches sent on the ZeroMQ PUB socket."}),
			dropped: f.NewCounter(prometheus.CounterOpts{Name: NamePubDropped,
				Help: "KV event batches dropped because the send queue was full."}),
			replays: f.NewCounterVec(prometheus.CounterOpts{Name: NamePubReplayRequests,
				Help: "Replay requests served, by result."}, []string{"result"}),
		}}
	p.m.replays.WithLabelValues("ok")
	p.m.replays.WithLabelValues("malformed")
	return p, nil
}

// Publish queues b (Topic and Seq are set by the publisher). It never
// blocks; beyond MaxQueue waiting batches it drops b and counts it, and
// subscribers see a gap that replay cannot fill.
func (p *Publisher) Publish(b Batch) {
	p.enqueue(item{b: b})
}

func (p *Publisher) enqueue(it item) {
	p.mu.Lock()
	if len(p.queue) >= p.cfg.MaxQueue {
		p.mu.Unlock()
		p.m.dropped.Inc()
		return
	}
	p.queue = append(p.queue, it)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Ready is closed once Run has bound its sockets; Endpoint and
// ReplayEndpoint then give the bound addresses.
func (p *Publisher) Ready() <-chan struct{} { return p.ready }

// Endpoint is the PUB socket's address (the bound one, after Ready).
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint is the ROUTER's bound address after Ready ("" without
// replay).
func (p *Publisher) ReplayEndpoint() string { return p.replayEndpoint }

// Run binds (or dials) and publishes until ctx ends. Batches still queued
// then are sent before it returns. It returns only after its replay
// goroutine exited.
func (p *Publisher) Run(ctx context.Context) error {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	pubOpts := []zmq4.Option{zmq4.WithLogger(p.zlog)}
	if p.cfg.Dial {
		pubOpts = append(pubOpts, zmq4.WithAutomaticReconnect(true), zmq4.WithDialerMaxRetries(-1),
			zmq4.WithDialerRetry(100*time.Millisecond))
	}
	pub := zmq4.NewPub(sctx, pubOpts...)
	defer closePubWriter(pub) // after Close (defers run last first)
	defer pub.Close()
	if p.cfg.Dial {
		// Dial retries until it connects; stopping Run cancels the socket,
		// which ends the retries.
		dialed := make(chan error, 1)
		go func() { dialed <- pub.Dial(p.cfg.Endpoint) }()
		select {
		case err := <-dialed:
			if err != nil {
				return fmt.Errorf("enginekv: connect %s: %w", p.cfg.Endpoint, err)
			}
		case <-ctx.Done():
			cancel()
			if err := <-dialed; err != nil {
				p.log.Debug("dial ended by stop", zap.Error(err))
			}
			return nil
		}
		p.endpoint = p.cfg.Endpoint
	} else {
		if err := pub.Listen(listenAddr(p.cfg.Endpoint)); err != nil {
			return fmt.Errorf("enginekv: bind %s: %w", p.cfg.Endpoint, err)
		}
		p.endpoint = boundEndpoint(p.cfg.Endpoint, pub.Addr())
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	if p.cfg.ReplayEndpoint != "" {
		router := zmq4.NewRouter(sctx, zmq4.WithLogger(p.zlog), zmq4.WithTimeout(5*time.Second))
		defer router.Close()
		if err := router.Listen(listenAddr(p.cfg.ReplayEndpoint)); err != nil {
			return fmt.Errorf("enginekv: bind replay %s: %w", p.cfg.ReplayEndpoint, err)
		}
		p.replayEndpoint = boundEndpoint(p.cfg.ReplayEndpoint, router.Addr())
		wg.Add(1)
		go func() { defer wg.Done(); p.serveReplay(sctx, router) }()
	}
	p.mu.Lock()
	p.sock = pub
	p.mu.Unlock()
	p.log.Info("publishing", zap.String("endpoint", p.endpoint), zap.String("replay", p.replayEndpoint),
		zap.Stringer("layout", p.cfg.Encoding.Layout), zap.Stringer("hashes", p.cfg.Encoding.Hashes))
	close(p.ready)

	var seq uint64
	var buf []byte
	for {
		p.mu.Lock()
		q := p.queue
		p.queue = nil
		p.mu.Unlock()
		for _, it := range q {
			if it.raw != nil {
				_ = pub.Send(zmq4.NewMsgFrom(it.raw...))
				continue
			}
			it.b.DPRank = p.cfg.DPRank
			buf = AppendBatch(buf[:0], it.b, p.cfg.Encoding)
			payload := append([]byte(nil), buf...)
			p.remember(seq, payload)
			if p.skipLive == nil || !p.skipLive(seq) {
				// A PUB send only queues (zmq4 drops at its high-water mark).
				if err := pub.Send(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqBytes(seq), payload)); err != nil {
					p.log.Warn("publish", zap.Error(err))
				}
				p.m.batches.Inc()
			}
			seq++
		}
		if len(q) == 0 && ctx.Err() != nil {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-p.wake:
		}
	}
}

// boundEndpoint replaces the port of ep with the one actually bound (port 0
// picks one).
func boundEndpoint(ep string, a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return ep
	}
	host := "127.0.0.1"
	if !ta.IP.IsUnspecified() {
		host = ta.IP.String()
	}
	return "tcp://" + net.JoinHostPort(host, fmt.Sprint(ta.Port))
}

func (p *Publisher) remember(seq uint64, payload []byte) {
	p.mu.Lock()
	p.ring[p.ringPos] = entry{seq: seq, payload: payload}
	p.ringPos = (p.ringPos + 1) % len(p.ring)
	p.ringLen = min(p.ringLen+1, len(p.ring))
	p.mu.Unlock()
}

// since copies the buffered entries with seq >= start, oldest first.
func (p *Publisher) since(start uint64) []entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []entry
	first := (p.ringPos - p.ringLen + len(p.ring)) % len(p.ring)
	for i := range p.ringLen {
		e := p.ring[(first+i)%len(p.ring)]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}

// serveReplay answers [identity, empty, start] requests (also [identity,
// start] from a DEALER that sends no delimiter) with one reply per buffered
// batch from start, then the end marker.
func (p *Publisher) serveReplay(ctx context.Context, router zmq4.Socket) {
	for {
		m, err := router.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.log.Debug("replay receive", zap.Error(err))
			continue
		}
		f := m.Frames
		var start []byte
		switch {
		case len(f) == 3 && len(f[1]) == 0 && len(f[2]) == 8:
			start = f[2]
		case len(f) == 2 && len(f[1]) == 8:
			start = f[1]
		default:
			p.m.replays.WithLabelValues("malformed").Inc()
			p.log.Warn("invalid replay request", zap.Int("frames", len(f)))
			continue
		}
		id := f[0]
		from := seqFrom(start)
		for _, e := range p.since(from) {
			if err := router.Send(zmq4.NewMsgFrom(p.replyFrames(id, seqBytes(e.seq), e.payload)...)); err != nil {
				p.log.Debug("replay send", zap.Error(err))
				break
			}
		}
		_ = router.Send(zmq4.NewMsgFrom(p.replyFrames(id, seqBytes(EndSeq), []byte{})...))
		p.m.replays.WithLabelValues("ok").Inc()
	}
}

func (p *Publisher) replyFrames(id, seq, payload []byte) [][]byte {
	if p.cfg.ReplyWithTopic {
		topic := []byte(p.cfg.Topic)
		if seqFrom(seq) == EndSeq {
			topic = []byte{}
		}
		return [][]byte{id, {}, topic, seq, payload}
	}
	return [][]byte{id, {}, seq, payload}
}

func seqFrom(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// subscribed reports whether a subscription has reached the PUB socket.
func (p *Publisher) subscribed() bool {
	p.mu.Lock()
	s := p.sock
	p.mu.Unlock()
	t, ok := s.(zmq4.Topics)
	return ok && len(t.Topics()) > 0
}

// injectRaw queues a message sent as is, without a sequence number (tests
// send corrupt frames with it).
func (p *Publisher) injectRaw(frames ...[]byte) {
	p.enqueue(item{raw: frames})
}
