package app

// The nemesis's environment: an etcd it can stop and start again on the same
// address and data, a NATS server it owns, a proxy per replica connection
// that it can cut and that can drop or duplicate the replica's life marks,
// and a clock it can skew. See nemesis_test.go.

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
)

// nemesisEtcd is a single-member embedded etcd that can be stopped and
// started again on the same URLs and data directory (its leases survive a
// restart, as a real member's do).
type nemesisEtcd struct {
	dir          string
	client, peer string // host:port
	mu           sync.Mutex
	e            *embed.Etcd // nil while stopped
}

func newNemesisEtcd(dir string, clientPort, peerPort int) *nemesisEtcd {
	return &nemesisEtcd{dir: dir, client: net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort)),
		peer: net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))}
}

func (n *nemesisEtcd) endpoint() string { return "http://" + n.client }

// start starts the member; it retries while the old member's ports are
// still being released.
func (n *nemesisEtcd) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.e != nil {
		return nil
	}
	var last error
	for range 50 {
		cfg := embed.NewConfig()
		cfg.Dir = n.dir
		cfg.Logger = "zap"
		cfg.LogLevel = "fatal"
		cfg.LogOutputs = []string{"stderr"}
		cu, pu := &url.URL{Scheme: "http", Host: n.client}, &url.URL{Scheme: "http", Host: n.peer}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
		cfg.InitialCluster = cfg.Name + "=" + pu.String()
		cfg.ListenMetricsUrls = nil
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			last = err
			time.Sleep(100 * time.Millisecond)
			continue
		}
		select {
		case <-e.Server.ReadyNotify():
			n.e = e
			return nil
		case <-time.After(30 * time.Second):
			e.Close()
			return errors.New("embedded etcd did not become ready within 30s")
		}
	}
	return fmt.Errorf("start embedded etcd: %w", last)
}

// stop stops the member (no-op while stopped).
func (n *nemesisEtcd) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.e != nil {
		n.e.Close()
		n.e = nil
	}
}

// startNemesisNATS starts a NATS server on a random loopback port. The
// caller shuts it down.
func startNemesisNATS() (*natsserver.Server, error) {
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoLog: true, NoSigs: true,
		MaxControlLine: 4096, MaxPayload: 8 << 20})
	if err != nil {
		return nil, err
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("nats server not ready within 10s")
	}
	return s, nil
}

// markMode is what a tampering proxy does to the life marks a replica
// publishes.
type markMode int32

const (
	marksPass markMode = iota
	marksDrop
	marksDuplicate
)

// faultProxy is a testenv.Proxy whose client-to-server copy can tamper
// with the NATS protocol the client sends: with a prefix set, every PUB/HPUB whose subject starts with it is
// dropped or sent twice (with probability prob) while the mode says so.
// Cut closes every connection and refuses new ones until Restore.
type faultProxy struct {
	*testenv.Proxy
	prefix string

	mode       atomic.Int32 // markMode
	prob       atomic.Uint64
	dropped    atomic.Int64
	duplicated atomic.Int64

	mu  sync.Mutex
	rnd *rand.Rand // guarded by mu

	cutMu sync.Mutex
	cuts  int // faults holding the link cut now (hold, release); guarded by cutMu
}

// hold cuts the link for one fault. Faults on the same link nest (a
// nats_cut on the replica an owner_nats_cut also cuts): the link comes back
// when the last of them releases it.
func (p *faultProxy) hold() {
	p.cutMu.Lock()
	defer p.cutMu.Unlock()
	p.cuts++
	p.Cut()
}

// release ends one hold.
func (p *faultProxy) release() {
	p.cutMu.Lock()
	defer p.cutMu.Unlock()
	p.cuts--
	if p.cuts == 0 {
		p.Restore()
	}
}

func startFaultProxy(target, natsPrefix string, seed uint64) (*faultProxy, error) {
	return startFaultProxyAt("127.0.0.1:0", target, natsPrefix, seed)
}

// startFaultProxyAt is startFaultProxy listening on listen.
func startFaultProxyAt(listen, target, natsPrefix string, seed uint64) (*faultProxy, error) {
	p := &faultProxy{prefix: natsPrefix, rnd: rand.New(rand.NewPCG(seed, 0x70726f7879))}
	var upstream func(io.Writer, io.Reader) error
	if natsPrefix != "" {
		upstream = p.copyNATS
	}
	px, err := testenv.NewProxy(listen, target, upstream)
	if err != nil {
		return nil, err
	}
	p.Proxy = px
	return p, nil
}

func (p *faultProxy) addr() string { return p.Addr() }

func (p *faultProxy) setMarks(m markMode, prob float64) {
	p.prob.Store(uint64(prob * 1e6))
	p.mode.Store(int32(m))
}

func (p *faultProxy) close() { p.Close() }

// roll decides one tampered message.
func (p *faultProxy) roll() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rnd.Float64()*1e6 < float64(p.prob.Load())
}

// copyNATS forwards the client side of the NATS protocol operation by
// operation, dropping or duplicating the publications to p.prefix.
func (p *faultProxy) copyNATS(dst io.Writer, src io.Reader) error {
	r := bufio.NewReaderSize(src, 64<<10)
	w := bufio.NewWriterSize(dst, 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return err
		}
		line = append([]byte(nil), line...)
		var payload []byte
		f := bytes.Fields(line)
		isPub := len(f) >= 3 && (bytes.EqualFold(f[0], []byte("PUB")) || bytes.EqualFold(f[0], []byte("HPUB")))
		if isPub {
			n, err := strconv.Atoi(string(f[len(f)-1]))
			if err != nil || n < 0 {
				return fmt.Errorf("nats proxy: bad size in %q", line)
			}
			payload = make([]byte, n+2) // the payload and its CRLF
			if _, err := io.ReadFull(r, payload); err != nil {
				return err
			}
		}
		copies := 1
		if isPub && bytes.HasPrefix(f[1], []byte(p.prefix)) {
			switch markMode(p.mode.Load()) {
			case marksDrop:
				if p.roll() {
					copies = 0
					p.dropped.Add(1)
				}
			case marksDuplicate:
				if p.roll() {
					copies = 2
					p.duplicated.Add(1)
				}
			}
		}
		for range copies {
			_, _ = w.Write(line)
			_, _ = w.Write(payload)
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return err
			}
		}
	}
}

// gossipKeyring is a replica's gossip keyring file (gossip.Config's
// KeyringFile): gossip_cut_one writes a key of the replica's own into it,
// so that it and the others drop each other's packets and streams (each
// side cannot decrypt the other's), and the cluster's key back to heal. It
// cuts gossip only, both ways, and leaves etcd and NATS alone: a proxy
// could not, since memberlist dials its peers' addresses directly.
type gossipKeyring struct {
	path   string
	shared []byte // the cluster's key
	own    []byte // the key that isolates this replica
}

func newGossipKeyring(dir string, shared []byte, seed uint64, idx int) (*gossipKeyring, error) {
	own := make([]byte, len(shared))
	rng := rand.New(rand.NewPCG(seed, uint64(idx)+0x676f73))
	for i := range own {
		own[i] = byte(rng.UintN(256))
	}
	k := &gossipKeyring{path: filepath.Join(dir, fmt.Sprintf("keyring-%d", idx)), shared: shared, own: own}
	return k, k.write(shared)
}

// write replaces the file in one rename, so the watcher never reads half.
func (k *gossipKeyring) write(key []byte) error {
	tmp := k.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, k.path)
}

func (k *gossipKeyring) isolate() error { return k.write(k.own) }
func (k *gossipKeyring) rejoin() error  { return k.write(k.shared) }

// skewClock is wall time shifted by an offset the nemesis sets; timers run
// on wall time (a skewed clock still measures durations right).
type skewClock struct {
	clock.Real // timers, tickers and After
	off        atomic.Int64
}

func (c *skewClock) Now() time.Time      { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *skewClock) set(d time.Duration) { c.off.Store(int64(d)) }
