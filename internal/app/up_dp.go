package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/switchyard/switchyard/adapter"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/metrics"
)

// Data-parallel engines in `up -dp-size N` (with -protocol vllm): each
// simulated engine is what vLLM run with --data-parallel-size N is, one API
// server in front of N engine cores (ranks), each with its own KV cache,
// its own KV event publisher on the engine's event port + rank (and replay
// port + rank), data_parallel_rank stamped in its batches and its metrics
// labelled engine="<rank>". The API server hands a request to the rank its
// X-data-parallel-rank header names, or to the next rank in turn.
//
// Beside each engine run N adapters, one per rank (-dp-rank r -dp-size N),
// as adapter/dp.go describes: each registers worker-<i>-dp<r> at the API
// server's URL, so routers route to a rank and pin it with the header.
//
// Ports of engine i: its API server on -worker-port + i; its event ports
// -zmq-port + 2·N·i + r and replay ports -zmq-port + 2·N·i + N + r; its
// ranks' adapters on -adapter-port + N·i + r. Each rank's own HTTP server
// (what the API server proxies to) takes any free port.
//
// Under -tls every rank engine and the API server serve HTTPS with the
// engines' certificate and require a client certificate (the routers' and
// the adapters'), as a single engine does; the API server reaches its
// ranks with the workers' client certificate; each rank's adapter serves
// HTTPS and uses the etcd and NATS credentials of its rank (its NATS user
// is the rank's worker id, so it publishes only its rank's events).

// dpRanks is the number of ranks per simulated engine (1 without -dp-size).
func (c UpConfig) dpRanks() int { return max(1, c.DPSize) }

// startDPEngine runs engine i as N rank engines behind one API server
// (dpFront) with one adapter per rank.
func startDPEngine(ctx context.Context, grp *errgroup.Group, cfg UpConfig, i int, wc WorkerConfig, etcdURL, natsURL string, pki *upPKI, log *zap.Logger) {
	n := cfg.DPSize
	base := portAt(cfg.ZMQPort, 2*n*i)
	tcp := func(port int) string { return "tcp://" + net.JoinHostPort(cfg.Host, strconv.Itoa(port)) }
	rankURLs := make([]chan string, n)
	for r := range n {
		rc := wc
		rc.ID = adapter.DPWorkerID(wc.ID, r) // its logger's name: a rank engine registers nowhere
		rc.Protocol = ProtocolVLLM
		rc.Listen = net.JoinHostPort(cfg.Host, "0")
		rc.VLLM.DPRank = r
		rc.VLLM.EventsBind, rc.VLLM.ReplayBind = tcp(base+r), tcp(base+n+r)
		served := make(chan string, 1) // size 1: Ready is called once and must not block
		rc.Ready = func(u string) { served <- u }
		if pki != nil {
			rc.TLS = tlsconf.ServerConfig{CertFile: pki.worker.Cert, KeyFile: pki.worker.Key, ClientCAFile: pki.worker.CA}
		}
		rankURLs[r] = served
		grp.Go(named(ctx, rc.ID, func(ctx context.Context) error {
			return RunWorker(ctx, rc, log.Named(rc.ID), metrics.NewRegistry())
		}))
	}
	// The API server starts once every rank serves; the adapters once it
	// does (they probe it), each told its rank's own metrics.
	urls := make([]string, n)
	front := make([]chan string, n)
	for r := range front {
		front[r] = make(chan string, 1)
	}
	grp.Go(named(ctx, wc.ID, func(ctx context.Context) error {
		for r, ch := range rankURLs {
			select {
			case urls[r] = <-ch:
			case <-ctx.Done():
				return nil
			}
		}
		var srv, cli *tls.Config
		if pki != nil {
			var err error
			if srv, err = (tlsconf.ServerConfig{CertFile: pki.worker.Cert, KeyFile: pki.worker.Key, ClientCAFile: pki.worker.CA}).Build(tlsconf.Deps{Name: wc.ID}); err != nil {
				return err
			}
			if cli, err = (tlsconf.ClientConfig{CAFile: pki.workerClient.CA, CertFile: pki.workerClient.Cert, KeyFile: pki.workerClient.Key}).Build(tlsconf.Deps{Name: wc.ID + "_ranks"}); err != nil {
				return err
			}
		}
		return runDPFront(ctx, wc.Listen, urls, srv, cli, func(u string) {
			for _, ch := range front {
				ch <- u
			}
		})
	}))
	for r := range n {
		ac := adapter.DefaultConfig()
		ac.Engine = adapter.EngineVLLM
		ac.KVEvents, ac.KVReplay = tcp(base), tcp(base+n) // the adapter moves to port + rank itself
		ac.ID, ac.Cluster = wc.ID, wc.Cluster
		ac.DPRank, ac.DPSize = r, n
		ac.Listen = net.JoinHostPort(cfg.Host, strconv.Itoa(portAt(cfg.AdapterPort, n*i+r)))
		ac.EtcdEndpoints, ac.NATSURL = []string{etcdURL}, natsURL
		var lk Links
		if pki != nil {
			lk = pki.workerLinks(adapter.DPWorkerID(wc.ID, r))
			ac.EngineTLS = tlsconf.ClientConfig{CAFile: pki.workerClient.CA, CertFile: pki.workerClient.Cert, KeyFile: pki.workerClient.Key}
			ac.TLS = tlsconf.ServerConfig{CertFile: pki.adapter.Cert, KeyFile: pki.adapter.Key}
		}
		name := adapter.DPWorkerID(wc.ID, r) + "-adapter"
		grp.Go(named(ctx, name, func(ctx context.Context) error {
			select {
			case ac.EngineURL = <-front[r]:
			case <-ctx.Done():
				return nil
			}
			ac.MetricsURL = urls[r] + "/metrics" // written before front[r] was sent
			return RunAdapterWithLinks(ctx, ac, lk, log.Named(name), nil)
		}))
	}
}

// errBadRank is the API server's answer to a rank header out of range.
var errBadRank = errors.New("the X-data-parallel-rank header names no rank of this engine")

// runDPFront serves the API server of a data-parallel engine on listen
// until ctx ends: a request with X-data-parallel-rank goes to that rank,
// one without to the next rank in turn; GET /health, /v1/models and
// /metrics go to rank 0 (its /metrics holds rank 0's series only: each
// rank's adapter scrapes its rank directly). ready gets its URL. With
// srv it serves HTTPS, and with cli it reaches https:// ranks.
func runDPFront(ctx context.Context, listen string, ranks []string, srv, cli *tls.Config, ready func(string)) error {
	targets := make([]*url.URL, len(ranks))
	for r, u := range ranks {
		t, err := url.Parse(u)
		if err != nil {
			return fmt.Errorf("rank %d url: %w", r, err)
		}
		targets[r] = t
	}
	var next atomic.Uint64
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cli
	defer tr.CloseIdleConnections()
	proxy := &httputil.ReverseProxy{
		Transport:     tr,
		FlushInterval: -1, // stream every chunk as it comes
		Rewrite: func(pr *httputil.ProxyRequest) {
			r := 0
			if h := pr.In.Header.Get(adapter.DPRankHeader); h != "" {
				r, _ = strconv.Atoi(h) // checked by the handler
			} else if pr.In.Method == http.MethodPost {
				r = int(next.Add(1)-1) % len(targets)
			}
			pr.SetURL(targets[r])
			pr.Out.Host = pr.In.Host
		},
	}
	h := http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if s := req.Header.Get(adapter.DPRankHeader); s != "" {
			if r, err := strconv.Atoi(s); err != nil || r < 0 || r >= len(targets) {
				rw.Header().Set("Content-Type", "application/json")
				rw.WriteHeader(http.StatusBadRequest)
				_, _ = fmt.Fprintf(rw, `{"error":{"message":%q,"type":"BadRequestError","code":400}}`,
					fmt.Sprintf("%v: %q (data parallel size %d)", errBadRank, s, len(targets)))
				return
			}
		}
		proxy.ServeHTTP(rw, req)
	})
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	scheme := "http://"
	if srv != nil {
		l, scheme = tls.NewListener(l, srv), "https://"
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ready(scheme + l.Addr().String())
	done := make(chan error, 1)
	go func() { done <- hs.Serve(l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
