package gossip

import (
	"context"
	"fmt"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
)

// The repair path's behaviour (repair.go has the design and the codec):
// the owner compares a peer's digest with its own state and asks for what
// differs, answers the fetches it gets, and joins the answers. Fetches and
// answers go out through the sender goroutine, because SendReliable dials
// a TCP stream and neither the owner nor a memberlist callback may block.

// Fetch events (label values of switchyard_gossip_fetches_total).
const (
	fetchRequested = "requested"  // fetch messages this replica sent
	fetchAnswered  = "answered"   // answers this replica sent (one per origin)
	fetchReceived  = "received"   // answers this replica joined
	fetchFailed    = "send_error" // fetches or answers that could not be sent
	fetchDropped   = "queue_full" // fetches or answers dropped: the send queue was full
)

var fetchEvents = []string{fetchRequested, fetchAnswered, fetchReceived, fetchFailed, fetchDropped}

// sendQueueSize bounds the fetches and answers waiting for the sender.
const sendQueueSize = 64

type outMsg struct {
	to   string
	kind msgKind
	msg  []byte
}

// sendLoop sends queued fetches and answers until ctx is done.
func (g *Gossip) sendLoop(ctx context.Context, ml *memberlist.Memberlist) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-g.outbox:
			// The address comes from this replica's member table, never
			// from memberlist's own records, which its packet handler
			// rewrites without a lock (members.go).
			err := fmt.Errorf("%s is not a live member", m.to)
			if to, ok := g.members.node(m.to); ok {
				err = ml.SendReliable(to, m.msg)
			}
			if err != nil {
				g.m.fetches.WithLabelValues(fetchFailed).Inc()
				g.log.Debug("gossip repair send failed", zap.String("to", m.to), zap.Stringer("kind", m.kind), zap.Error(err))
			}
		}
	}
}

// send queues a fetch or answer for the sender without blocking.
func (o *owner) send(to string, kind msgKind, msg []byte) bool {
	select {
	case o.g.outbox <- outMsg{to: to, kind: kind, msg: msg}:
		return true
	default:
		o.g.m.fetches.WithLabelValues(fetchDropped).Inc()
		return false
	}
}

// handleDigest compares a peer's push-pull digest with this state and
// fetches from the peer every origin whose entries differ. Floors are
// applied at once.
func (o *owner) handleDigest(d *digestMsg) {
	if d.From == o.self {
		return
	}
	var fetch []fetchOrigin
	for origin, theirs := range d.Origins {
		if origin == o.self {
			if theirs.Floor > 0 {
				o.reassert(nil, theirs.Floor)
			}
			// Only claims newer than this origin's own, or about workers it
			// never wrote, need an answer from it; a peer that is merely
			// behind fetches from it instead.
			mine := o.state.summary(origin)
			if theirs.Newest > mine.Newest || theirs.Count > mine.Count {
				fetch = append(fetch, o.fetchOrigin(origin, mine, theirs))
			}
			continue
		}
		if theirs.Floor > o.state.Floors[origin] {
			o.state.join(State{Floors: map[string]uint64{origin: theirs.Floor}}, func(string, string, Entry, bool) { o.dirty = true })
			o.stateDirty = true
		}
		if mine := o.state.summary(origin); !mine.sameEntries(theirs) {
			fetch = append(fetch, o.fetchOrigin(origin, mine, theirs))
		}
	}
	if len(fetch) == 0 {
		return
	}
	if o.send(d.From, kindFetch, appendFetch(nil, &fetchMsg{From: o.self, Origins: sortedOrigins(fetch)})) {
		o.g.m.fetches.WithLabelValues(fetchRequested).Inc()
	}
}

func (o *owner) fetchOrigin(origin string, mine, theirs originSummary) fetchOrigin {
	bits := bucketBits(max(mine.Count, theirs.Count))
	return fetchOrigin{Origin: origin, Bits: bits, Buckets: o.state.buckets(origin, bits)}
}

// handleFetch answers a fetch: per origin asked, the entries of the
// buckets that differ (State.answerBuckets), one answer message each.
func (o *owner) handleFetch(f *fetchMsg) {
	if f.From == o.self {
		return
	}
	for _, fo := range f.Origins {
		es := o.state.answerBuckets(fo, fo.Origin == f.From)
		if len(es) == 0 {
			continue
		}
		a := answerMsg{From: o.self, State: State{Origins: map[string]map[string]Entry{fo.Origin: es}}}
		a.State.setFloor(fo.Origin, o.state.Floors[fo.Origin])
		if o.send(f.From, kindAnswer, appendAnswer(nil, &a)) {
			o.g.m.fetches.WithLabelValues(fetchAnswered).Inc()
		}
	}
}

// handleAnswer joins a fetch answer like a full state: claims about this
// origin are reasserted, the rest joined.
func (o *owner) handleAnswer(a *answerMsg) {
	o.g.m.fetches.WithLabelValues(fetchReceived).Inc()
	s := a.State
	if claims, floor := s.Origins[o.self], s.Floors[o.self]; claims != nil || floor > 0 {
		o.g.m.fetchedEntries.WithLabelValues("own").Add(float64(len(claims)))
		delete(s.Origins, o.self)
		o.reassert(claims, floor)
	}
	total, fresh := 0, 0
	for _, es := range s.Origins {
		total += len(es)
	}
	o.state.join(s, func(_, _ string, _ Entry, ok bool) {
		o.dirty = true
		if ok {
			fresh++
		}
	})
	o.stateDirty = true
	o.g.m.fetchedEntries.WithLabelValues("new").Add(float64(fresh))
	o.g.m.fetchedEntries.WithLabelValues("known").Add(float64(total - fresh))
}

// notifyRepair is NotifyMsg for fetches and answers. A digest belongs in
// push-pull only.
func (d *delegate) notifyRepair(buf []byte) {
	g := d.g
	m, err := decodeRepair(buf)
	if err == nil && m.kind == kindDigest {
		err = fmt.Errorf("%w: digest outside push-pull", ErrMalformed)
	}
	if err != nil {
		g.m.decodeErrors.WithLabelValues("message").Inc()
		g.log.Debug("rejected gossip repair message", zap.Int("bytes", len(buf)), zap.Error(err))
		return
	}
	g.m.messageBytes.WithLabelValues(m.kind.String()).Observe(float64(len(buf)))
	g.handOff(inboxItem{kind: m.kind, repair: &m})
}

// mergeDigest is MergeRemoteState for a digest.
func (d *delegate) mergeDigest(buf []byte) {
	g := d.g
	m, err := decodeRepair(buf)
	if err == nil && m.kind != kindDigest {
		err = fmt.Errorf("%w: %s message in push-pull", ErrMalformed, m.kind)
	}
	if err != nil {
		g.m.decodeErrors.WithLabelValues("state").Inc()
		g.log.Debug("rejected gossip digest", zap.Int("bytes", len(buf)), zap.Error(err))
		return
	}
	g.m.messageBytes.WithLabelValues(kindDigest.String()).Observe(float64(len(buf)))
	g.handOff(inboxItem{kind: kindDigest, repair: &m})
}

// encodeDigest is the push-pull payload of this state.
func (o *owner) encodeDigest(timestamp int64) []byte {
	return appendDigest(nil, &digestMsg{From: o.self, Timestamp: timestamp, Origins: o.state.digest()})
}
