package admission

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
)

func TestASessionAffinityCrossesTheWireToTheOwner(t *testing.T) {
	r := &scheduler.Request{ID: "r", Class: "c", Ingress: time.Unix(1, 0),
		Session: scheduler.SessionAffinity{Worker: "w2", Hard: true, MarginRatio: 0.5, MarginCost: 20}}
	require.Equal(t, r.Session, RequestFromWire(RequestToWire(r, "e")).Session)
	r.Session = scheduler.SessionAffinity{}
	w := RequestToWire(r, "e")
	require.Nil(t, w.Session, "no session, nothing on the wire")
	require.Equal(t, scheduler.SessionAffinity{}, RequestFromWire(w).Session)
}
