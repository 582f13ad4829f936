package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Etcd is a running embedded etcd member.
type Etcd struct {
	Server    *embed.Etcd
	Endpoints []string
}

// StartEtcd starts a single-member etcd on loopback with ephemeral ports and a
// temporary data directory. It is stopped when the test ends.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(t.TempDir(), "etcd")
	cfg.Logger = "zap"
	cfg.LogLevel = "fatal" // etcd logs expected shutdown noise at error level
	cfg.LogOutputs = []string{"stderr"}
	clientURL := mustURL(t, "http://127.0.0.1:"+strconv.Itoa(FreePort(t)))
	peerURL := mustURL(t, "http://127.0.0.1:"+strconv.Itoa(FreePort(t)))
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	cfg.ListenMetricsUrls = nil
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		t.Fatalf("embedded etcd did not become ready within 30s")
	}
	t.Cleanup(e.Close)
	return &Etcd{Server: e, Endpoints: []string{clientURL.String()}}
}

// Client returns a client connected to the member, closed when the test ends.
func (e *Etcd) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   e.Endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// NATS is a running in-process NATS server.
type NATS struct {
	Server *natsserver.Server
	URL    string
}

// StartNATS starts a NATS server on 127.0.0.1 with a random port. It is shut
// down when the test ends.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	return startNATS(t, natsserver.RANDOM_PORT)
}

// StartNATSAt starts a NATS server on addr ("127.0.0.1:port"), e.g. to
// restart a server that a test shut down where its clients reconnect.
func StartNATSAt(t testing.TB, addr string) *NATS {
	t.Helper()
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("nats address %q: %v", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		t.Fatalf("nats port %q: %v", portStr, err)
	}
	return startNATS(t, port)
}

func startNATS(t testing.TB, port int) *NATS {
	s, err := newNATSServer(port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return &NATS{Server: s, URL: s.ClientURL()}
}

// newNATSServer starts the tests' NATS server on 127.0.0.1:port (in this
// process or in a child, StartNATSProcess) and waits until it accepts
// connections.
func newNATSServer(port int) (*natsserver.Server, error) {
	s, err := natsserver.NewServer(&natsserver.Options{
		Host:           "127.0.0.1",
		Port:           port,
		NoLog:          true,
		NoSigs:         true,
		MaxControlLine: 4096,
		MaxPayload:     8 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("new nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("nats server not ready within 10s")
	}
	return s, nil
}

// Conn returns a client connection to the server, closed when the test ends.
func (n *NATS) Conn(t testing.TB) *nats.Conn {
	t.Helper()
	return connectNATS(t, n.URL)
}

// connectNATS connects to url, named after the test, and closes the
// connection when the test ends.
func connectNATS(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(t.Name()))
	if err != nil {
		t.Fatalf("nats connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// FreePort returns a TCP port on 127.0.0.1 that is free now, for tests that
// must know an address before the server that binds it starts (e.g. a
// Prometheus scrape config). It picks from below the kernel's ephemeral
// range: a port the kernel hands out for ":0" is also what it hands to the
// next outgoing connection or ":0" listener of a test running in parallel,
// which can take it before the test binds it. Ports below the range are only
// ever taken on purpose.
func FreePort(t testing.TB) int {
	t.Helper()
	lo, hi := 20000, ephemeralLow()
	if hi <= lo {
		lo, hi = 10000, 20000
	}
	start := rand.IntN(hi - lo)
	for i := range hi - lo {
		port := lo + (start+i)%(hi-lo)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port
	}
	t.Fatalf("free port: none free in [%d, %d)", lo, hi)
	return 0
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}

// Eventually polls cond every 10ms until it returns true or the timeout
// passes, then fails the test with msg. Polling observable state instead of
// sleeping is the house rule for asynchronous tests.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			for i, a := range args { // pointers are read at failure time, so messages show final values
				if p, ok := a.(*float64); ok {
					args[i] = *p
				}
			}
			t.Fatalf("condition not met within %v: "+msg, append([]any{timeout}, args...)...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Context returns a context cancelled when the test ends.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

func mustURL(t testing.TB, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return u
}
