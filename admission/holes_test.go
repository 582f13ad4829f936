package admission

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// Tests for the holes of issue 19, one or more per item.

// rawAdmit sends one admit request as an entry replica would, on its own
// connection, and returns the owner's reply.
func rawAdmit(t *testing.T, h *harness, in *wire.AdmitRequest) *wire.AdmitReply {
	t.Helper()
	nc := rawConn(t, h)
	b, err := wire.EncodeAdmission(in)
	require.NoError(t, err)
	msg, err := nc.Request(wire.NewSubjects(cluster).Admit(in.Class), b, 5*time.Second)
	require.NoError(t, err)
	out, err := wire.DecodeAdmitReply(msg.Data)
	require.NoError(t, err)
	return out
}

func rawConn(t *testing.T, h *harness) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(h.nats.URL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func wireRequest(r *scheduler.Request) *wire.AdmitRequest { return RequestToWire(r, "entry") }

func TestAnOwnerRejectsAnAdmitRequestWhoseIngressLiesFarInItsFuture(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	a := h.start("a", nil)
	h.own("gold", "a", 1)
	in := wireRequest(request("gold", 0))
	in.IngressUnixNano = time.Now().Add(24 * time.Hour).UnixNano()

	out := rawAdmit(t, h, in)
	require.False(t, out.OK, "a request from a day ahead would sit at the head of an LCFS queue")
	require.Equal(t, scheduler.ReasonInvalidConstraint.String(), out.Reason)
	require.Equal(t, 1.0, testutil.ToFloat64(a.client.m.decodeErrors.WithLabelValues("admit")), "counted as bad input")
	require.Zero(t, a.counters(t, "gold").Admitted)
}
