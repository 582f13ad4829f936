package admission

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// BenchmarkStatusAnswer measures the owner's answer to one status probe,
// decided on its actor's turn (Server.status, NATS excluded), for an
// attempt that is queued, granted (its kept reply copied out) or unknown.
// actor_turn is the baseline of the same run: one empty turn of the actor,
// the least any answer read from the actor's state can cost.
func BenchmarkStatusAnswer(b *testing.B) {
	h := newBenchHarness(b)
	owner := h.start("a", nil)
	h.own("gold", "a", 1)
	srv := owner.server
	ctx := context.Background()

	b.Run("actor_turn", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = owner.actor.Do(ctx, func(*scheduler.Core) {})
		}
	})
	// A granted attempt, unacknowledged. It was admitted in process, so
	// its reply is kept here as the grant's turn keeps a remote one's.
	tk, err := owner.client.Admit(ctx, request("gold", 0))
	require.NoError(b, err)
	g := tk.Grant()
	srv.sent.save(statusKey{g.RequestID, 0}, g.Booking, &wire.AdmitReply{OK: true, Worker: g.Worker, Booking: uint64(g.Booking), Owner: "a"}, time.Now())
	cases := map[string]*wire.StatusRequest{
		"granted": {Class: "gold", ID: g.RequestID, Owner: "a", Entry: "b"},
		"unknown": {Class: "gold", ID: "never-seen", Owner: "a", Entry: "b"},
	}
	for _, name := range []string{"granted", "unknown"} {
		in := cases[name]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if out := srv.status(in); string(out.Status) != name {
					b.Fatalf("status %s, want %s", out.Status, name)
				}
			}
		})
	}
	tk.Dispatched()
	tk.Finish(false)
}

// BenchmarkStatusKeepGrant measures what the status probe adds to every
// remote grant: its reply kept on the grant's turn, forgotten at the
// entry's dispatched mark.
func BenchmarkStatusKeepGrant(b *testing.B) {
	var s sentGrants
	out := &wire.AdmitReply{OK: true, Worker: "w0", Booking: 1, Owner: "a", Candidates: []wire.Candidate{{Worker: "w1"}}}
	now := time.Now()
	ids := make([]scheduler.BookingID, 1)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		ids[0] = scheduler.BookingID(i)
		s.save(statusKey{"req", i}, ids[0], out, now)
		s.forgetBookings(ids)
	}
}
