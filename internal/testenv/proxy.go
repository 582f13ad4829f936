package testenv

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a loopback TCP proxy in front of one target address. Tests point a
// client at Addr instead of the target and use Cut to simulate a network
// partition between that one client and the server: the server stays up for
// everybody else, and the client sees its connections die and new ones fail.
type Proxy struct {
	target string
	ln     net.Listener
	// upstream copies the client-to-server direction (nil: io.Copy); a
	// fault-injecting test hands in one that tampers with what it forwards.
	upstream func(dst io.Writer, src io.Reader) error

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup // the accept loop and every piping goroutine
}

// StartProxy listens on 127.0.0.1 with an ephemeral port and forwards every
// accepted connection to target. The proxy and all its goroutines stop when
// the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := NewProxy("127.0.0.1:0", target, nil)
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// NewProxy is a Proxy listening on listen whose client-to-server direction is
// copied by upstream (nil: unchanged). The caller stops it with Close.
func NewProxy(listen, target string, upstream func(dst io.Writer, src io.Reader) error) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, upstream: upstream, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection through the proxy and makes it refuse new
// ones (they are accepted and closed at once) until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore lets new connections through again. Connections closed by Cut stay
// closed; clients reconnect on their own.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// track registers c unless the proxy is cut; it reports whether c may be used.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer client.Close()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer server.Close()
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{})
	go func() {
		// Closing both ends when one direction ends unblocks the other copy.
		if p.upstream != nil {
			_ = p.upstream(server, client)
		} else {
			_, _ = io.Copy(server, client)
		}
		_ = server.Close()
		_ = client.Close()
		close(done)
	}()
	_, _ = io.Copy(client, server)
	_ = server.Close()
	_ = client.Close()
	<-done
}
