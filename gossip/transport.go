package gossip

import (
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// countingTransport wraps memberlist's NetTransport and counts every byte
// memberlist writes, so bandwidth covers everything on the wire (probes,
// labels, encryption, push-pull), not only our payloads.
//
// It owns one goroutine (forward), which wraps inbound streams so replies on
// them are counted too. The goroutine starts in start and has exited when
// Shutdown returns.
type countingTransport struct {
	inner    *memberlist.NetTransport
	packets  prometheus.Counter
	streams  prometheus.Counter
	streamCh chan net.Conn
	done     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

var _ memberlist.NodeAwareTransport = (*countingTransport)(nil)

func newCountingTransport(inner *memberlist.NetTransport, sent *prometheus.CounterVec) *countingTransport {
	return &countingTransport{
		inner:    inner,
		packets:  sent.WithLabelValues("packet"),
		streams:  sent.WithLabelValues("stream"),
		streamCh: make(chan net.Conn),
		done:     make(chan struct{}),
	}
}

func (t *countingTransport) start() {
	t.wg.Add(1)
	go t.forward()
}

func (t *countingTransport) forward() {
	defer t.wg.Done()
	for {
		select {
		case <-t.done:
			return
		case c := <-t.inner.StreamCh():
			select {
			case t.streamCh <- &countingConn{Conn: c, n: t.streams}:
			case <-t.done:
				_ = c.Close()
				return
			}
		}
	}
}

func (t *countingTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.inner.FinalAdvertiseAddr(ip, port)
}

func (t *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	t.packets.Add(float64(len(b)))
	return t.inner.WriteTo(b, addr)
}

func (t *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	t.packets.Add(float64(len(b)))
	return t.inner.WriteToAddress(b, a)
}

func (t *countingTransport) PacketCh() <-chan *memberlist.Packet { return t.inner.PacketCh() }

func (t *countingTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := t.inner.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: t.streams}, nil
}

func (t *countingTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.inner.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: t.streams}, nil
}

func (t *countingTransport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown stops the inner transport, then the forwarder. memberlist calls
// it from Memberlist.Shutdown before its own listeners stop, so the forwarder
// keeps handing over streams the inner listener accepted until the listener
// is closed; otherwise the inner listener could block forever on its
// unbuffered stream channel.
func (t *countingTransport) Shutdown() error {
	var err error
	t.once.Do(func() {
		err = t.inner.Shutdown()
		close(t.done)
		t.wg.Wait()
	})
	return err
}

type countingConn struct {
	net.Conn
	n prometheus.Counter
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.Add(float64(n))
	return n, err
}
