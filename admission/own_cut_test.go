package admission

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// A replica whose NATS link is cut may still be acquiring a class when it
// withdraws (the ownership loop claimed it just before). Own used to flush
// the new subscriptions with a 2 s timeout that a dead connection always
// runs out, holding the ownership loop, so the hand-off of the classes the
// cut replica was giving up came 2 s later per class acquired (the nemesis's
// owner_nats_cut under -race: a class with a cut owner for 5.5 s against the
// 3 s of -nats-unreachable-after and one retry). Not a performance bound:
// the flush cannot succeed, so Own must not wait for it.
func TestOwnDoesNotWaitForAFlushItsCutConnectionCannotDo(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 1))
	px := testenv.StartProxy(t, strings.TrimPrefix(h.nats.URL, "nats://"))
	b := h.startAt("b", "nats://"+px.Addr(), nil)
	px.Cut()
	testenv.Eventually(t, 10*time.Second, func() bool { return !b.nc.IsConnected() }, "b's connection to drop")

	began := time.Now()
	require.NoError(t, b.server.Own("gold", 1))
	require.Less(t, time.Since(began), time.Second, "Own waited for a flush over a cut connection")
	_, owns := b.server.Owns("gold")
	require.True(t, owns)

	px.Restore() // the subscriptions reach the server once b reconnects
	testenv.Eventually(t, 10*time.Second, func() bool { return b.nc.IsConnected() }, "b to reconnect")
	require.NoError(t, b.nc.FlushTimeout(5*time.Second))
	for _, sub := range b.server.subscriptions("gold") {
		require.True(t, sub.IsValid())
	}
}

// A class disowned while the owner's NATS link is down must leave no
// subscription behind at the server. Draining then did: nats.go keeps a
// draining subscription in its table until the drain's flush returns,
// resends every subscription in that table when it reconnects, and then
// forgets the drained one without an UNSUB (the UNSUB is suppressed while
// reconnecting), so the server kept delivering the class's admits to a
// subscription nobody read. Entries then waited OwnerReplyTimeout (60 s)
// whenever the class had no other owner, instead of getting "no
// responders" at once (the nemesis's seed 3: silver answered after 60 s).
func TestADisownWhileCutLeavesNoSubscriptionAtTheServer(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 1))
	px := testenv.StartProxy(t, strings.TrimPrefix(h.nats.URL, "nats://"))
	b := h.startAt("b", "nats://"+px.Addr(), nil)
	require.NoError(t, b.server.Own("gold", 1))

	px.Cut()
	testenv.Eventually(t, 10*time.Second, func() bool { return !b.nc.IsConnected() }, "b's connection to drop")
	b.server.Disown("gold")
	px.Restore()
	testenv.Eventually(t, 10*time.Second, func() bool { return b.nc.IsConnected() }, "b to reconnect")
	require.NoError(t, b.nc.FlushTimeout(5*time.Second))

	probe, err := nats.Connect(h.nats.URL)
	require.NoError(t, err)
	defer probe.Close()
	// Wait out any drain still finishing in the client (its flush returned
	// above), then ask: nobody owns gold, so the server must say so.
	time.Sleep(300 * time.Millisecond)
	_, err = probe.Request(b.server.subj.Admit("gold"), []byte("{}"), 3*time.Second)
	require.ErrorIs(t, err, nats.ErrNoResponders,
		"an admit for a class nobody owns reached a subscription left behind by the disown")
}
