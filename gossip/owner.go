package gossip

import (
	"context"
	"math/bits"
	"sort"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/zeebo/xxh3"
	"go.uber.org/zap"
)

// owner is the state only the owner goroutine touches.
type owner struct {
	g          *Gossip
	ml         *memberlist.Memberlist
	self       string
	state      State
	version    uint64 // this origin's newest version
	predID     uint64
	digests    map[string]Digest // sampled local digests
	lastDigest time.Time
	departing  map[string]time.Time // origin → removal deadline
	seenPreds  map[predKey]int64    // prediction chunk → expiry (unix ns)
	dirty      bool                 // the read snapshot is stale
	stateDirty bool                 // the push-pull encoding is stale
	lastEncode time.Time
}

type predKey struct {
	origin string
	id     uint64
}

func (g *Gossip) ownerLoop(ctx context.Context, ml *memberlist.Memberlist) {
	now := g.clock.Now()
	o := &owner{
		g:         g,
		ml:        ml,
		self:      g.cfg.NodeName,
		version:   uint64(now.UnixNano()),
		predID:    uint64(now.UnixNano()),
		departing: make(map[string]time.Time),
		seenPreds: make(map[predKey]int64),
	}
	ticker := time.NewTicker(g.cfg.Interval)
	defer ticker.Stop()
	o.tick()
	for {
		select {
		case <-ctx.Done():
			return
		case it := <-g.inbox:
			o.handle(it)
		drain:
			for n := 1; n < inboxBatch; n++ {
				select {
				case it = <-g.inbox:
					o.handle(it)
				default:
					break drain
				}
			}
			o.publish()
		case req := <-g.preds:
			o.predict(req)
		case req := <-g.sessions:
			o.shareSession(req)
		case <-ticker.C:
			o.tick()
		}
	}
}

// nextVersion returns a version above every version this origin used or was
// told about. It follows the clock, so a restarted replica (same name, fresh
// counter) still outranks what it wrote before.
func (o *owner) nextVersion() uint64 {
	o.version = max(o.version+1, uint64(o.g.clock.Now().UnixNano()))
	return o.version
}

func (o *owner) tick() {
	now := o.g.clock.Now()
	o.coalesce(now)
	o.checkDepartures(now)
	for k, exp := range o.seenPreds {
		if exp < now.UnixNano() {
			delete(o.seenPreds, k)
		}
	}
	o.publish()
	if o.stateDirty && now.Sub(o.lastEncode) >= stateEncodeInterval {
		b := o.encodeDigest(now.UnixNano())
		o.g.pushSt.Store(&b)
		o.stateDirty = false
		o.lastEncode = now
	}
	o.g.m.members.Set(float64(o.ml.NumMembers()))
	o.g.m.healthScore.Set(float64(o.ml.GetHealthScore()))
	o.g.m.queued.Set(float64(o.g.queue.NumQueued()))
}

// coalesce compares the newest local loads and digests with what this origin
// last announced and broadcasts the shards whose entries changed.
func (o *owner) coalesce(now time.Time) {
	var loads map[string]WorkerLoad
	if p := o.g.loads.Load(); p != nil {
		loads = *p
	}
	if o.digests == nil || now.Sub(o.lastDigest) >= o.g.cfg.DigestInterval {
		o.digests = nil
		if p := o.g.digests.Load(); p != nil {
			o.digests = *p
		}
		o.lastDigest = now
	}
	var health map[string]Health
	if p := o.g.health.Load(); p != nil {
		health = *p
	}
	own := o.state.Origins[o.self]
	changed := make(map[string]Entry)
	consider := func(w string) {
		if _, done := changed[w]; done {
			return
		}
		want := Entry{Load: loads[w], Digest: o.digests[w], Health: health[w]}
		cur, ok := own[w]
		if !ok && want.sameValue(Entry{}) {
			return
		}
		if !ok || !cur.sameValue(want) {
			changed[w] = want
		}
	}
	for w := range loads {
		consider(w)
	}
	for w := range o.digests {
		consider(w)
	}
	for w := range health {
		consider(w)
	}
	for w := range own {
		consider(w)
	}
	if len(changed) > 0 {
		o.stamp(changed)
	}
}

// stamp records new values for this origin's workers under one new version
// and broadcasts the shards they live in.
func (o *owner) stamp(values map[string]Entry) {
	v := o.nextVersion()
	src := State{Origins: map[string]map[string]Entry{o.self: {}}}
	for w, e := range values {
		e.Version = v
		src.Origins[o.self][w] = e
	}
	o.state.join(src, nil)
	o.dirty, o.stateDirty = true, true
	own := o.state.Origins[o.self]
	sb := shardBits(len(own))
	shards := make(map[uint32]bool)
	for w := range values {
		shards[shardOf(w, sb)] = true
	}
	for s := range shards {
		o.broadcastShard(sb, s, own)
	}
}

func shardBits(n int) uint8 {
	shards := (n + entriesPerShard - 1) / entriesPerShard
	if shards <= 1 {
		return 0
	}
	return min(uint8(bits.Len(uint(shards-1))), maxShardBits)
}

func shardOf(worker string, sb uint8) uint32 {
	return uint32(xxh3.HashString(worker) & (1<<sb - 1))
}

// broadcastShard queues every entry of own in shard s, split into parts that
// each fit MaxMessageBytes.
func (o *owner) broadcastShard(sb uint8, s uint32, own map[string]Entry) {
	var workers []string
	for w := range own {
		if shardOf(w, sb) == s {
			workers = append(workers, w)
		}
	}
	sort.Strings(workers)
	m := loadsMsg{Origin: o.self, Version: o.version, Timestamp: o.g.clock.Now().UnixNano(), ShardBits: sb, Shard: s}
	// The header as encoded with no entries, plus room for the count to grow
	// to three varint bytes.
	header := len(appendLoads(nil, &m)) + 2
	size := header
	var scratch []byte
	flush := func() {
		b := appendLoads(nil, &m)
		o.g.queue.QueueBroadcast(&namedBroadcast{name: m.broadcastName(), msg: b})
		m.Part++
		m.Entries = m.Entries[:0]
		size = header
	}
	for _, w := range workers {
		e := own[w]
		scratch = appendEntry(scratch[:0], m.Version, w, e)
		if len(m.Entries) > 0 && size+len(scratch) > o.g.cfg.MaxMessageBytes {
			flush()
		}
		m.Entries = append(m.Entries, workerEntry{Worker: w, Entry: e})
		size += len(scratch)
	}
	if len(m.Entries) > 0 {
		flush()
	}
}

func (o *owner) handle(it inboxItem) {
	switch it.kind {
	case kindLoads:
		o.handleLoads(it.loads, it.raw)
	case kindPrediction:
		o.handlePrediction(it.pred, it.raw)
	case kindState:
		o.handleState(*it.state)
	case kindSession:
		o.handleSession(it.sess, it.raw)
	case kindDigest:
		o.handleDigest(it.repair.digest)
	case kindFetch:
		o.handleFetch(it.repair.fetch)
	case kindAnswer:
		o.handleAnswer(it.repair.answer)
	}
}

func (o *owner) handleLoads(m *loadsMsg, raw []byte) {
	entries := make(map[string]Entry, len(m.Entries))
	for _, e := range m.Entries {
		entries[e.Worker] = e.Entry
	}
	if m.Origin == o.self {
		o.reassert(entries, 0)
		return
	}
	news := false
	o.state.join(State{Origins: map[string]map[string]Entry{m.Origin: entries}}, func(string, string, Entry, bool) { news = true })
	if !news {
		return
	}
	o.dirty, o.stateDirty = true, true
	o.g.m.lag.Observe(o.g.clock.Now().Sub(time.Unix(0, m.Timestamp)).Seconds())
	// Epidemic relay: memberlist only retransmits what its own node queued,
	// so a message that told us something new is passed on under the same
	// name (a newer one replaces it in our queue).
	o.g.queue.QueueBroadcast(&namedBroadcast{name: m.broadcastName(), msg: raw})
	o.g.m.relayed.WithLabelValues(kindLoads.String()).Inc()
}

// handleState joins a full state from push-pull: what a replica of codec
// version 3 or older sends during a rolling upgrade.
func (o *owner) handleState(s State) {
	if claims, floor := s.Origins[o.self], s.Floors[o.self]; claims != nil || floor > 0 {
		delete(s.Origins, o.self)
		o.reassert(claims, floor)
	}
	o.state.join(s, func(string, string, Entry, bool) { o.dirty = true })
	// A raised floor changes the state without changing an entry; the
	// encoding is rate-limited, so refreshing it after every push-pull is
	// cheap.
	o.stateDirty = true
}

// reassert answers what others claim about this origin: a claim this origin
// did not make (from an earlier incarnation, or a removal by others that
// wrongly thought it dead) is overwritten with the current value under a
// newer version. Only the origin authors its own entries.
func (o *owner) reassert(claims map[string]Entry, floor uint64) {
	own := o.state.Origins[o.self]
	fix := make(map[string]Entry)
	for w, c := range claims {
		o.version = max(o.version, c.Version)
		cur, ok := own[w]
		switch {
		case !ok && !c.sameValue(Entry{}):
			fix[w] = Entry{}
		case ok && (c.Version > cur.Version || (c.Version == cur.Version && !c.sameValue(cur))):
			fix[w] = cur
		}
	}
	if floor > 0 {
		o.version = max(o.version, floor)
		for w, cur := range own {
			if cur.Version <= floor {
				fix[w] = cur
			}
		}
	}
	if len(fix) > 0 {
		o.g.log.Info("reasserting own entries", zap.Int("workers", len(fix)), zap.Uint64("floor", floor))
		o.stamp(fix)
	}
	if floor > 0 {
		o.state.join(State{Floors: map[string]uint64{o.self: floor}}, nil)
	}
}

// fresh reports whether a relayed message (a prediction or a session
// decision) from another replica is new and unexpired, and marks it seen:
// each is handed on and relayed once.
func (o *owner) fresh(origin string, id uint64, ts, expires int64) bool {
	if origin == o.self {
		return false
	}
	k := predKey{origin, id}
	if _, seen := o.seenPreds[k]; seen {
		return false
	}
	now := o.g.clock.Now()
	if expires <= now.UnixNano() {
		o.g.m.dropped.WithLabelValues(dropExpired).Inc()
		return false
	}
	o.seenPreds[k] = expires
	o.g.m.lag.Observe(now.Sub(time.Unix(0, ts)).Seconds())
	return true
}

func (o *owner) handlePrediction(m *predictionMsg, raw []byte) {
	if !o.fresh(m.Origin, m.ID, m.Timestamp, m.Expires) {
		return
	}
	if f := o.g.sink.Load(); f != nil {
		(*f)(m.Worker, m.Hashes, time.Unix(0, m.Expires))
	}
	o.g.queue.QueueBroadcast(&uniqueBroadcast{msg: raw})
	o.g.m.relayed.WithLabelValues(kindPrediction.String()).Inc()
}

// predict gossips a local prediction, split into chunks that each fit a
// message. Every chunk has its own id, so receivers deduplicate chunks.
func (o *owner) predict(req predictRequest) {
	now := o.g.clock.Now()
	m := predictionMsg{Origin: o.self, Timestamp: now.UnixNano(), Worker: req.worker, Expires: now.Add(req.ttl).UnixNano()}
	// Header with the largest id and count varints.
	m.ID = ^uint64(0)
	// Validate and maxNameLen guarantee room for dozens of hashes; max keeps
	// the loop finite regardless.
	per := max(1, (o.g.cfg.MaxMessageBytes-len(appendPrediction(nil, &m))-3)/8)
	for start := 0; start < len(req.hashes); start += per {
		o.predID++
		m.ID = o.predID
		m.Hashes = req.hashes[start:min(start+per, len(req.hashes))]
		o.g.queue.QueueBroadcast(&uniqueBroadcast{msg: appendPrediction(nil, &m)})
	}
}

// checkDepartures schedules the removal of origins that are no longer live
// members and removes those whose grace period has passed: their floor is
// raised to their newest version, so late or relayed copies of their entries
// stay removed.
func (o *owner) checkDepartures(now time.Time) {
	alive := make(map[string]bool)
	for _, n := range o.ml.Members() {
		alive[n.Name] = true
	}
	for origin := range o.state.Origins {
		if origin == o.self || alive[origin] {
			continue
		}
		if _, ok := o.departing[origin]; !ok {
			o.departing[origin] = now.Add(o.g.cfg.GracePeriod)
			o.g.log.Info("replica departed; removing its contributions after the grace period",
				zap.String("origin", origin), zap.Duration("grace_period", o.g.cfg.GracePeriod))
		}
	}
	for origin, deadline := range o.departing {
		switch {
		case alive[origin]:
			delete(o.departing, origin)
			o.g.log.Info("departed replica is back", zap.String("origin", origin))
		case o.state.Origins[origin] == nil:
			delete(o.departing, origin)
		case !now.Before(deadline):
			floor := o.state.maxVersion(origin)
			o.state.join(State{Floors: map[string]uint64{origin: floor}}, nil)
			delete(o.departing, origin)
			o.dirty, o.stateDirty = true, true
			o.g.log.Info("removed departed replica's contributions", zap.String("origin", origin))
		}
	}
	o.g.m.departing.Set(float64(len(o.departing)))
}

// publish rebuilds the read snapshot when the state changed.
func (o *owner) publish() {
	if !o.dirty {
		return
	}
	o.dirty = false
	s := &snapshot{remote: make(map[string]WorkerLoad), digests: make(map[string]map[string]Digest), health: make(map[string]Health)}
	for origin, es := range o.state.Origins {
		for w, e := range es {
			if e.Health != (Health{}) {
				s.health[w] = s.health[w].Join(e.Health)
			}
		}
		if origin == o.self {
			continue
		}
		ds := make(map[string]Digest)
		for w, e := range es {
			if e.Load != (WorkerLoad{}) {
				s.remote[w] = s.remote[w].add(e.Load)
			}
			if e.Digest != (Digest{}) {
				ds[w] = e.Digest
			}
		}
		if len(ds) > 0 {
			s.digests[origin] = ds
		}
	}
	o.g.snap.Store(s)
}
