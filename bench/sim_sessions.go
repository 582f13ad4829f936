package bench

import (
	"fmt"
	"strings"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/switchyard/switchyard/scheduler"
)

// Session affinity in the simulator: each replica keeps a session table
// as a router does (scheduler.SessionTable). The entry replica looks the
// session up when a turn arrives and hands its previous worker to the
// admitting Core as the request's soft affinity; when the turn is granted
// the entry replica records the worker at once and every other replica
// after GossipDelay (the gossiped session record). Off, sessions still
// measure whether consecutive turns stayed on one worker.

// SimSessionReport is how the run kept sessions on their workers.
type SimSessionReport struct {
	// Affinity says whether session affinity was on.
	Affinity bool `json:"affinity"`
	// Turns counts turns after a session's first; Stayed those that ran
	// on the worker of the session's previous turn (HitRate = Stayed /
	// Turns). Preferred counts turns whose entry replica knew the previous
	// worker and told the scheduler; Moved those of them routed elsewhere
	// (the worker was saturated).
	Turns     int     `json:"turns"`
	Stayed    int     `json:"stayed"`
	HitRate   float64 `json:"hit_rate"`
	Preferred int     `json:"preferred"`
	Moved     int     `json:"moved"`
}

// simSessions is the run's session state.
type simSessions struct {
	tables []*scheduler.SessionTable // per replica (affinity on only)
	last   map[string]int            // session → worker of its latest granted turn
	report SimSessionReport
}

func newSimSessions(cfg SimConfig) *simSessions {
	ss := &simSessions{last: map[string]int{}, report: SimSessionReport{Affinity: cfg.Sessions}}
	if cfg.Sessions {
		for range cfg.Replicas {
			ss.tables = append(ss.tables, scheduler.NewSessionTable(1<<20, cfg.SessionTTL))
		}
	}
	return ss
}

func simSessionID(session string) uint64 { return xxh3.HashString(session) }

// affinity is what the entry replica tells the scheduler about q's session.
func (s *simulation) sessionAffinity(q *simRequest) scheduler.SessionAffinity {
	ss := s.sessions
	if !s.cfg.Sessions || q.tr.Session == "" {
		return scheduler.SessionAffinity{}
	}
	w, ok := ss.tables[q.entry].Lookup(simSessionID(q.tr.Session), s.clock.Now())
	if !ok {
		return scheduler.SessionAffinity{}
	}
	q.sessionPrev = w
	return scheduler.SessionAffinity{Worker: w, MarginRatio: s.cfg.SessionMargin}
}

// sessionGranted records q's grant of worker w: in the measurement, at the
// entry replica now and at the others after the gossip delay.
func (s *simulation) sessionGranted(q *simRequest, w int) {
	ss := s.sessions
	if q.tr.Session == "" {
		return
	}
	if prev, ok := ss.last[q.tr.Session]; ok {
		ss.report.Turns++
		if prev == w {
			ss.report.Stayed++
		}
	}
	ss.last[q.tr.Session] = w
	if q.sessionPrev != "" {
		ss.report.Preferred++
		if q.sessionPrev != s.workers[w].id {
			ss.report.Moved++
		}
	}
	if !s.cfg.Sessions {
		return
	}
	id := simSessionID(q.tr.Session)
	now := s.clock.Now()
	ss.tables[q.entry].Record(id, s.workers[w].id, now, now.Add(s.cfg.SessionTTL))
	if !s.cfg.Gossip {
		return // each replica knows the sessions it routed
	}
	for r := range s.replicas {
		if r != q.entry {
			s.schedule(simEvent{at: s.clock.now + int64(s.cfg.GossipDelay), kind: evSession, a: r, b: w, exp: int64(id), hashes: []uint64{uint64(s.clock.now)}})
		}
	}
}

// applySession is a gossiped session record reaching replica e.a.
func (s *simulation) applySession(e simEvent) {
	at := simEpoch.Add(time.Duration(e.hashes[0]))
	s.sessions.tables[e.a].Record(uint64(e.exp), s.workers[e.b].id, at, at.Add(s.cfg.SessionTTL))
}

func (ss *simSessions) final() SimSessionReport {
	r := ss.report
	if r.Turns > 0 {
		r.HitRate = float64(r.Stayed) / float64(r.Turns)
	}
	return r
}

// writeSimSessionsMarkdown writes the session table when any run had
// multi-turn sessions.
func writeSimSessionsMarkdown(b *strings.Builder, runs []simRun) {
	any := false
	for _, r := range runs {
		any = any || r.report.Sessions.Turns > 0
	}
	if !any {
		return
	}
	b.WriteString("\nSessions (turns after a session's first: on the previous turn's worker; TTFT over every request):\n\n")
	b.WriteString("| run | affinity | later turns | stayed | hit rate | preferred | moved (saturated) | TTFT p50 ms | TTFT p99 ms |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range runs {
		ss, sum := r.report.Sessions, r.report.Summary
		fmt.Fprintf(b, "| %s | %s | %d | %d | %.1f%% | %d | %d | %.0f | %.0f |\n", mdEscape(r.report.Label),
			map[bool]string{true: "on", false: "off"}[ss.Affinity], ss.Turns, ss.Stayed, 100*ss.HitRate, ss.Preferred, ss.Moved,
			sum.TTFT.P50, sum.TTFT.P99)
	}
}
