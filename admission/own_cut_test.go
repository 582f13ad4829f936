package admission

import (
	"strings"
	"testing"
	"time"

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
