package app

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

// A request whose connection fails before its body is whole was served by
// no one: the worker counts it as unread, apart from the requests it served
// or that were cancelled while it worked on them (a router re-admits such a
// request elsewhere, and the end-to-end suite checks that each admitted
// request is served once).
func TestARequestWhoseBodyNeverArrivesIsCountedUnread(t *testing.T) {
	cfg := testWorkerConfig()
	cfg.EtcdEndpoints, cfg.NATSURL = nil, ""
	w := startWorker(t, cfg)
	outcome := func(o string) float64 {
		return testenv.MetricValue(t, w.reg, "switchyard_worker_http_requests_total", map[string]string{"outcome": o})
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(w.url, "http://"))
	require.NoError(t, err)
	_, err = io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
	require.NoError(t, err)
	// Closed with the headers and part of the body sent: the worker reads
	// both before the end of the stream, so its handler sees the body cut.
	require.NoError(t, conn.Close())
	testenv.Eventually(t, 10*time.Second, func() bool { return outcome("unread") == 1 }, "the request counted unread")
	require.Zero(t, outcome("cancelled"))
	require.Zero(t, outcome("ok"))
}
