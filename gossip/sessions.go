package gossip

import (
	"encoding/binary"
	"fmt"
	"time"
)

// Session records share the session → worker map between replicas: when
// a replica routes a turn of a session it gossips the decision, so the
// session's next turn finds that worker at whichever replica it enters,
// before any KV event could have told that replica where the prefix is.
//
//	session (kind 4): origin | id uvarint | timestamp varint | session u64 |
//	                  worker | expires varint
//
// The kind was added without a codec version bump: a replica of the
// previous release still reads every loads message and counts a session
// message as malformed (decode errors, "message"), and its sessions route
// by cache and load alone. Like predictions, session records are unique
// broadcasts, deduplicated by (origin, id) and relayed once; push-pull
// does not carry them, so a replica that joins learns the sessions routed
// after it joined.
const kindSession msgKind = 4

// sessionMsg is one routing decision of one session.
type sessionMsg struct {
	Origin    string
	ID        uint64
	Timestamp int64 // when the origin routed the turn (unix ns, its clock)
	Session   uint64
	Worker    string
	Expires   int64 // unix ns, the origin's clock
}

// SessionSink receives the session routing decisions other replicas
// gossiped: session routed to worker at time at, the entry living until
// expires. Like PredictionSink it is called from the owner goroutine only
// and must return quickly.
type SessionSink func(session uint64, worker string, at, expires time.Time)

type sessionRequest struct {
	session uint64
	worker  string
	ttl     time.Duration
}

func appendSession(b []byte, m *sessionMsg) []byte {
	b = appendHeader(b, kindSession)
	b = appendString(b, m.Origin)
	b = binary.AppendUvarint(b, m.ID)
	b = binary.AppendVarint(b, m.Timestamp)
	b = binary.LittleEndian.AppendUint64(b, m.Session)
	b = appendString(b, m.Worker)
	b = binary.AppendVarint(b, m.Expires)
	return b
}

// isSessionMessage reports whether p claims to be a session message of a
// codec version that has them (3 and later; decodeSession then checks the
// rest).
func isSessionMessage(p []byte) bool {
	return len(p) >= 4 && p[0] == 'S' && p[1] == 'G' && p[2] >= broadcastVersion && p[2] <= codecVersion && msgKind(p[3]) == kindSession
}

// decodeSession parses a session message. Errors wrap ErrForeign,
// ErrVersion or ErrMalformed; it never panics.
func decodeSession(p []byte) (*sessionMsg, error) {
	r := newReader(p)
	if k := msgKind(r.u8()); r.err == nil && k != kindSession {
		return nil, fmt.Errorf("%w: %s message, want session", ErrMalformed, k)
	}
	m := &sessionMsg{}
	m.Origin = r.str()
	m.ID = r.uvarint()
	m.Timestamp = r.varint()
	m.Session = r.u64()
	m.Worker = r.str()
	m.Expires = r.varint()
	r.end()
	if r.err == nil && (m.Origin == "" || m.Worker == "" || len(m.Worker) > maxNameLen) {
		r.fail("empty origin or bad worker %q", m.Worker)
	}
	if r.err != nil {
		return nil, fmt.Errorf("session: %w", r.err)
	}
	return m, nil
}

// ShareSession gossips that session was routed to worker, the entry
// living ttl. It never blocks: when the queue is full the record is
// dropped and counted, and the session's next turn at another replica
// routes by cache and load.
func (g *Gossip) ShareSession(session uint64, worker string, ttl time.Duration) {
	if ttl <= 0 || !g.validWorker(worker) {
		return
	}
	select {
	case g.sessions <- sessionRequest{session: session, worker: worker, ttl: ttl}:
	default:
		g.m.dropped.WithLabelValues(dropSessionFull).Inc()
	}
}

// SetSessionSink sets the function that receives other replicas' session
// records. nil removes it.
func (g *Gossip) SetSessionSink(f SessionSink) {
	if f == nil {
		g.sessionSink.Store(nil)
		return
	}
	g.sessionSink.Store(&f)
}

// notifySession is NotifyMsg for session messages.
func (d *delegate) notifySession(buf []byte) {
	g := d.g
	m, err := decodeSession(buf)
	if err != nil {
		g.m.decodeErrors.WithLabelValues("message").Inc()
		return
	}
	g.m.messageBytes.WithLabelValues(kindSession.String()).Observe(float64(len(buf)))
	g.handOff(inboxItem{kind: kindSession, raw: append([]byte(nil), buf...), sess: m})
}

// shareSession broadcasts a local routing decision.
func (o *owner) shareSession(req sessionRequest) {
	now := o.g.clock.Now()
	o.predID++
	m := sessionMsg{Origin: o.self, ID: o.predID, Timestamp: now.UnixNano(), Session: req.session,
		Worker: req.worker, Expires: now.Add(req.ttl).UnixNano()}
	o.g.queue.QueueBroadcast(&uniqueBroadcast{msg: appendSession(nil, &m)})
}

// handleSession hands another replica's decision to the sink once and
// relays it once.
func (o *owner) handleSession(m *sessionMsg, raw []byte) {
	if !o.fresh(m.Origin, m.ID, m.Timestamp, m.Expires) {
		return
	}
	if f := o.g.sessionSink.Load(); f != nil {
		(*f)(m.Session, m.Worker, time.Unix(0, m.Timestamp), time.Unix(0, m.Expires))
	}
	o.g.queue.QueueBroadcast(&uniqueBroadcast{msg: raw})
	o.g.m.relayed.WithLabelValues(kindSession.String()).Inc()
}
