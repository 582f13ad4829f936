package gossip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
)

// Option adjusts a Gossip at construction.
type Option func(*Gossip)

// WithClock replaces the wall clock. Grace periods, prediction expiry,
// versions and lag are computed from its Now; tests inject a fake to step
// past a grace period. The coalescing ticker runs on wall time: it is a rate
// limit on bandwidth, not a deadline.
func WithClock(c clock.Clock) Option { return func(g *Gossip) { g.clock = c } }

// PredictionSink receives predicted prefixes other replicas gossiped. It is
// called from the owner goroutine only, never from a memberlist callback, and
// must return quickly: while it runs no gossip is processed.
type PredictionSink func(worker string, seqHashes []uint64, expires time.Time)

// Member is one live gossip member.
type Member struct {
	Name string
	Addr string // host:port of its gossip endpoint
	Meta NodeMeta
}

const (
	// entriesPerShard is the target number of workers per load shard. A
	// change re-sends its whole shard, so small shards keep the bytes per
	// change low (a 4-entry shard message is ~150 bytes); the measured lag
	// under load halved going from 16 to 4 (BenchmarkBandwidth1000Workers).
	entriesPerShard = 4
	maxShardBits    = 12
	// maxNameLen bounds node names and the worker ids this replica gossips,
	// so that a message header and one entry always fit MaxMessageBytes.
	// Longer worker ids are dropped and counted (reason="invalid_worker").
	maxNameLen = 128
	// stateEncodeInterval bounds how often the push-pull state is re-encoded.
	// Push-pull is anti-entropy; a state up to this old is fine for it.
	stateEncodeInterval = 500 * time.Millisecond
	// inboxBatch bounds how many queued messages are applied before the
	// read snapshot is republished.
	inboxBatch = 256
)

// Gossip is one replica's member of the gossip cluster. See the package
// documentation for its concurrency rules.
type Gossip struct {
	cfg   Config
	log   *zap.Logger
	m     *metrics
	clock clock.Clock
	meta  []byte
	queue *memberlist.TransmitLimitedQueue
	inbox chan inboxItem
	preds chan predictRequest
	// sessions queues ShareSession records for the owner (sessions.go).
	sessions chan sessionRequest
	ready    chan struct{}
	running  atomic.Bool
	stopped  atomic.Bool
	// mlogClosed silences memberlist's logger once Run has shut it down
	// (logger.go says why).
	mlogClosed  atomic.Bool
	ml          atomic.Pointer[memberlist.Memberlist]
	addr        atomic.Pointer[string]
	loads       atomic.Pointer[map[string]WorkerLoad]
	digests     atomic.Pointer[map[string]Digest]
	health      atomic.Pointer[map[string]Health]
	sink        atomic.Pointer[PredictionSink]
	sessionSink atomic.Pointer[SessionSink]
	snap        atomic.Pointer[snapshot]
	pushSt      atomic.Pointer[[]byte] // the encoded push-pull digest
	// outbox queues fetches and answers for the sender goroutine (fetch.go).
	outbox   chan outMsg
	delegate *delegate
	members  *memberTable // live members, copied in memberlist's callbacks
	// keyring is memberlist's (nil: no encryption); SetKeys and the keyring
	// file watcher change it while memberlist runs (it locks itself).
	keyring *memberlist.Keyring
	km      keyringMetrics
	// muteBroadcasts makes GetBroadcasts discard what it would send: tests
	// set it to lose broadcasts, leaving push-pull and its fetches as the
	// only way state travels.
	muteBroadcasts atomic.Bool
	lostBroadcasts atomic.Int64 // what muteBroadcasts discarded
}

type inboxItem struct {
	kind  msgKind
	raw   []byte
	loads *loadsMsg
	pred  *predictionMsg
	state *State
	sess  *sessionMsg
	// repair is a digest, fetch or answer (repair.go).
	repair *repairMsg
}

type predictRequest struct {
	worker string
	hashes []uint64
	ttl    time.Duration
}

// snapshot is what readers outside the owner goroutine see. It is immutable
// once published.
type snapshot struct {
	remote  map[string]WorkerLoad
	digests map[string]map[string]Digest
	health  map[string]Health // joined over every origin, this one's included
}

// New validates cfg and builds a Gossip. It starts nothing: Run does.
func New(cfg Config, log *zap.Logger, reg prometheus.Registerer, opts ...Option) (*Gossip, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	meta, err := EncodeNodeMeta(cfg.meta())
	if err != nil {
		return nil, err
	}
	cfg.Join = slices.Clone(cfg.Join)
	cfg.SecretKey = slices.Clone(cfg.SecretKey)
	keyring, err := newKeyring(cfg)
	if err != nil {
		return nil, err
	}
	g := &Gossip{
		keyring: keyring,
		km:      newKeyringMetrics(reg),
		cfg:     cfg,
		log:     log.Named("gossip"),
		m:       newMetrics(reg),
		clock:   clock.Real{},
		meta:    meta,
		inbox:   make(chan inboxItem, cfg.InboxSize),
		preds:   make(chan predictRequest, cfg.PredictionQueueSize),
		// Session records are as frequent as predictions (one per routed
		// turn) and share their bound.
		sessions: make(chan sessionRequest, cfg.PredictionQueueSize),
		ready:    make(chan struct{}),
		outbox:   make(chan outMsg, sendQueueSize),
	}
	for _, o := range opts {
		o(g)
	}
	g.queue = &memberlist.TransmitLimitedQueue{
		NumNodes: func() int {
			if ml := g.ml.Load(); ml != nil {
				return ml.NumMembers()
			}
			return 1
		},
		RetransmitMult: cfg.RetransmitMult,
	}
	g.delegate = &delegate{g: g}
	g.members = newMemberTable()
	g.snap.Store(&snapshot{})
	empty := appendDigest(nil, &digestMsg{From: cfg.NodeName})
	g.pushSt.Store(&empty)
	return g, nil
}

// Ready is closed once memberlist listens, so Addr is valid.
func (g *Gossip) Ready() <-chan struct{} { return g.ready }

// Addr is the advertised host:port, valid once Ready is closed.
func (g *Gossip) Addr() string {
	if a := g.addr.Load(); a != nil {
		return *a
	}
	return ""
}

// SetLocalLoads replaces this replica's own per-worker load aggregates. It
// copies the map and never blocks; the owner goroutine picks the newest value
// up on its next tick, so calls between ticks coalesce. Workers missing from
// the map count as idle.
func (g *Gossip) SetLocalLoads(loads map[string]WorkerLoad) {
	g.loads.Store(validCopy(g, loads))
}

// validCopy copies a per-worker map, dropping (and counting) the entries
// whose worker name could not be gossiped.
func validCopy[V any](g *Gossip, m map[string]V) *map[string]V {
	cp := make(map[string]V, len(m))
	for w, v := range m {
		if g.validWorker(w) {
			cp[w] = v
		}
	}
	return &cp
}

func (g *Gossip) validWorker(w string) bool {
	if w == "" || len(w) > maxNameLen {
		g.m.dropped.WithLabelValues(dropInvalidWorker).Inc()
		return false
	}
	return true
}

// SetDigests replaces this replica's KV index digests (per worker). Sampled
// every DigestInterval.
func (g *Gossip) SetDigests(d map[string]Digest) {
	g.digests.Store(validCopy(g, d))
}

// SetLocalHealth replaces this replica's own health records (per worker;
// see Health). Like SetLocalLoads it copies the map, never blocks, and is
// announced on the owner's next tick. A worker missing from the map has no
// record: drop a record once it no longer matters (older than the
// suspicion TTL), or it is gossiped for ever.
func (g *Gossip) SetLocalHealth(h map[string]Health) {
	g.health.Store(validCopy(g, h))
}

// Health returns worker's health joined over every origin this replica
// knows, its own announced records included: the newest SuspectSince and
// the newest RecoveredAt. It never blocks.
func (g *Gossip) Health(worker string) Health {
	return g.snap.Load().health[worker]
}

// HealthRecords returns a copy of the joined health of every worker with a
// record.
func (g *Gossip) HealthRecords() map[string]Health {
	s := g.snap.Load()
	out := make(map[string]Health, len(s.health))
	for w, h := range s.health {
		out[w] = h
	}
	return out
}

// RemoteLoad is the sum of worker's load over every other origin this replica
// knows (departed ones until their grace period ends). It never blocks.
func (g *Gossip) RemoteLoad(worker string) WorkerLoad {
	return g.snap.Load().remote[worker]
}

// RemoteDigests returns a copy of the other origins' digests: origin →
// worker → digest.
func (g *Gossip) RemoteDigests() map[string]map[string]Digest {
	s := g.snap.Load()
	out := make(map[string]map[string]Digest, len(s.digests))
	for o, ws := range s.digests {
		cp := make(map[string]Digest, len(ws))
		for w, d := range ws {
			cp[w] = d
		}
		out[o] = cp
	}
	return out
}

// Predict gossips that worker is expected to hold seqHashes for ttl. It
// copies seqHashes and never blocks: when the queue is full the prediction is
// dropped and counted. The local index records its own prediction itself;
// this replica's sink is not called for it.
func (g *Gossip) Predict(worker string, seqHashes []uint64, ttl time.Duration) {
	if len(seqHashes) == 0 || ttl <= 0 || !g.validWorker(worker) {
		return
	}
	select {
	case g.preds <- predictRequest{worker: worker, hashes: slices.Clone(seqHashes), ttl: ttl}:
	default:
		g.m.dropped.WithLabelValues(dropPredictionFull).Inc()
	}
}

// SetPredictionSink sets the function that receives other replicas'
// predictions. nil removes it.
func (g *Gossip) SetPredictionSink(f PredictionSink) {
	if f == nil {
		g.sink.Store(nil)
		return
	}
	g.sink.Store(&f)
}

// Members lists live members (this replica included), sorted by name, or
// nil when Run is not running. It reads this replica's copy of the member
// list (memberTable), never memberlist's own node records.
func (g *Gossip) Members() []Member {
	if g.ml.Load() == nil {
		return nil
	}
	names, copies := g.members.snapshot()
	out := make([]Member, 0, len(names))
	for i, name := range names {
		mb := Member{Name: name, Addr: copies[i].addr}
		if meta, err := DecodeNodeMeta(copies[i].meta); err != nil {
			g.m.decodeErrors.WithLabelValues("meta").Inc()
		} else {
			mb.Meta = meta
		}
		out = append(out, mb)
	}
	return out
}

// NumMembers is the number of live members (this replica included), 0 when
// Run is not running.
func (g *Gossip) NumMembers() int {
	ml := g.ml.Load()
	if ml == nil {
		return 0
	}
	return ml.NumMembers()
}

// Run creates the memberlist, joins the configured members (retrying in the
// background until one join succeeds) and runs the owner loop until ctx is
// done. It then leaves the cluster gracefully, shuts memberlist down and
// returns after every goroutine it started has exited. Run may be called
// once.
func (g *Gossip) Run(ctx context.Context) error {
	if !g.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	if g.keyring == nil {
		g.log.Warn("gossip is not encrypted: no secret key configured")
	}
	ml, err := g.createMemberlist()
	if err != nil {
		return err
	}
	g.ml.Store(ml)
	addr := net.JoinHostPort(ml.LocalNode().Addr.String(), strconv.Itoa(int(ml.LocalNode().Port)))
	g.addr.Store(&addr)
	g.log.Info("gossip member up", zap.String("node", g.cfg.NodeName), zap.String("addr", addr))
	close(g.ready)

	ownerCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		g.joinLoop(ownerCtx, ml)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		g.sendLoop(ownerCtx, ml)
	}()
	if g.cfg.KeyringFile != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.watchKeyring(ownerCtx)
		}()
	}
	g.ownerLoop(ownerCtx, ml)
	cancel()
	wg.Wait()
	g.stopped.Store(true)

	var errs []error
	if !g.cfg.SkipLeave {
		if err := ml.Leave(g.cfg.LeaveTimeout); err != nil {
			errs = append(errs, fmt.Errorf("gossip leave: %w", err))
		}
	}
	if err := ml.Shutdown(); err != nil {
		errs = append(errs, fmt.Errorf("gossip shutdown: %w", err))
	}
	g.ml.Store(nil)
	g.mlogClosed.Store(true)
	if len(errs) > 0 {
		// Leaving is best effort: the others' failure detector covers a
		// missed leave, so this is logged rather than failing the replica.
		g.log.Warn("gossip did not leave cleanly", zap.Error(errors.Join(errs...)))
	}
	return nil
}

func (g *Gossip) createMemberlist() (*memberlist.Memberlist, error) {
	mlog := newMemberlistLogger(g.log.Named("memberlist"), g.m.memberlistLogs, &g.mlogClosed)
	var nt *memberlist.NetTransport
	var err error
	// With port 0 the transport binds TCP first and then UDP on the same
	// port, which another process may hold: retry a few times, as memberlist
	// itself does.
	for range 10 {
		nt, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{g.cfg.BindAddr},
			BindPort:  g.cfg.BindPort,
			Logger:    mlog,
		})
		if err == nil || g.cfg.BindPort != 0 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("gossip transport: %w", err)
	}
	tr := newCountingTransport(nt, g.m.transportSent)
	tr.start()

	mc := memberlist.DefaultLANConfig()
	mc.Name = g.cfg.NodeName
	mc.BindAddr = g.cfg.BindAddr
	mc.BindPort = nt.GetAutoBindPort()
	mc.AdvertiseAddr = g.cfg.AdvertiseAddr
	mc.AdvertisePort = g.cfg.AdvertisePort
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = mc.BindPort
	}
	mc.Transport = tr
	mc.Label = g.cfg.ClusterLabel
	mc.Keyring = g.keyring
	mc.GossipInterval = g.cfg.GossipInterval
	mc.GossipNodes = g.cfg.GossipNodes
	mc.RetransmitMult = g.cfg.RetransmitMult
	mc.PushPullInterval = g.cfg.PushPullInterval
	mc.ProbeInterval = g.cfg.ProbeInterval
	mc.ProbeTimeout = g.cfg.ProbeTimeout
	mc.SuspicionMult = g.cfg.SuspicionMult
	mc.Delegate = g.delegate
	g.members.reset()
	mc.Events = g.members
	mc.Logger = mlog
	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = tr.Shutdown()
		return nil, fmt.Errorf("gossip create memberlist: %w", err)
	}
	return ml, nil
}

// joinLoop joins the configured members, retrying until one join succeeds or
// ctx is done.
func (g *Gossip) joinLoop(ctx context.Context, ml *memberlist.Memberlist) {
	if len(g.cfg.Join) == 0 {
		return
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := ml.Join(g.cfg.Join)
		if n > 0 {
			g.log.Info("joined gossip cluster", zap.Int("contacted", n), zap.Int("members", ml.NumMembers()))
			return
		}
		g.m.joinFailures.Inc()
		g.log.Warn("gossip join failed; retrying", zap.Strings("seeds", g.cfg.Join), zap.Error(err),
			zap.Duration("retry_in", g.cfg.JoinRetryInterval))
		t.Reset(g.cfg.JoinRetryInterval)
	}
}

// handOff passes a decoded message to the owner goroutine without blocking.
func (g *Gossip) handOff(it inboxItem) {
	if g.stopped.Load() {
		g.m.dropped.WithLabelValues(dropStopped).Inc()
		return
	}
	select {
	case g.inbox <- it:
	default:
		g.m.dropped.WithLabelValues(dropInboxFull).Inc()
	}
}

// namedBroadcast replaces a queued broadcast with the same name: a newer
// value of a shard part makes the older one pointless to send.
type namedBroadcast struct {
	name string
	msg  []byte
}

func (b *namedBroadcast) Invalidates(o memberlist.Broadcast) bool {
	n, ok := o.(*namedBroadcast)
	return ok && n.name == b.name
}
func (b *namedBroadcast) Name() string    { return b.name }
func (b *namedBroadcast) Message() []byte { return b.msg }
func (b *namedBroadcast) Finished()       {}

// uniqueBroadcast never invalidates another: each prediction chunk stands
// alone.
type uniqueBroadcast struct{ msg []byte }

func (b *uniqueBroadcast) Invalidates(memberlist.Broadcast) bool { return false }
func (b *uniqueBroadcast) UniqueBroadcast()                      {}
func (b *uniqueBroadcast) Message() []byte                       { return b.msg }
func (b *uniqueBroadcast) Finished()                             {}

// delegate implements memberlist.Delegate. Its methods run on memberlist's
// goroutines: they copy, decode and hand off without blocking.
type delegate struct{ g *Gossip }

var _ memberlist.Delegate = (*delegate)(nil)

func (d *delegate) NodeMeta(limit int) []byte {
	if len(d.g.meta) > limit {
		// Validate bounds meta by MaxMetaBytes, memberlist's limit; this only
		// trips if memberlist lowers it.
		d.g.log.Error("node meta exceeds memberlist limit", zap.Int("bytes", len(d.g.meta)), zap.Int("limit", limit))
		return nil
	}
	return d.g.meta
}

func (d *delegate) NotifyMsg(buf []byte) {
	g := d.g
	if isSessionMessage(buf) {
		d.notifySession(buf)
		return
	}
	if isRepairMessage(buf) {
		d.notifyRepair(buf)
		return
	}
	kind, lm, pm, _, err := decodeMessage(buf)
	if err == nil && kind == kindState {
		err = fmt.Errorf("%w: full state outside push-pull", ErrMalformed)
	}
	if err != nil {
		g.m.decodeErrors.WithLabelValues("message").Inc()
		g.log.Debug("rejected gossip message", zap.Int("bytes", len(buf)), zap.Error(err))
		return
	}
	g.m.messageBytes.WithLabelValues(kind.String()).Observe(float64(len(buf)))
	// The decoded message owns its strings and slices; the raw copy is kept
	// for relaying, since memberlist may reuse buf after we return.
	g.handOff(inboxItem{kind: kind, raw: slices.Clone(buf), loads: lm, pred: pm})
}

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	if d.g.muteBroadcasts.Load() {
		d.g.lostBroadcasts.Add(int64(len(d.g.queue.GetBroadcasts(overhead, limit))))
		return nil
	}
	msgs := d.g.queue.GetBroadcasts(overhead, limit)
	n := 0
	for _, m := range msgs {
		n += len(m)
	}
	d.g.m.broadcastBytes.Add(float64(n))
	return msgs
}

func (d *delegate) LocalState(bool) []byte {
	b := *d.g.pushSt.Load()
	d.g.m.stateBytes.Observe(float64(len(b)))
	return b
}

func (d *delegate) MergeRemoteState(buf []byte, _ bool) {
	g := d.g
	if isRepairMessage(buf) {
		d.mergeDigest(buf)
		return
	}
	// A full state: what a replica of codec version 3 or older sends.
	kind, _, _, sm, err := decodeMessage(buf)
	if err == nil && kind != kindState {
		err = fmt.Errorf("%w: %s message in push-pull", ErrMalformed, kind)
	}
	if err != nil {
		g.m.decodeErrors.WithLabelValues("state").Inc()
		g.log.Debug("rejected gossip state", zap.Int("bytes", len(buf)), zap.Error(err))
		return
	}
	g.m.messageBytes.WithLabelValues(kindState.String()).Observe(float64(len(buf)))
	g.handOff(inboxItem{kind: kindState, state: &sm.State})
}
