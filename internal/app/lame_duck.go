package app

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/switchyard/switchyard/scheduler"
)

// The replica's API and its stop: the lame duck described at RunReplica.
// Its steps are the Stop hooks of three services, which the manager calls
// in this order while everything they depend on still runs:
//
//	lame_duck      readiness fails, the API serves for DrainDelay, then
//	               answers 503 and drains; waiters are answered (Leave)
//	ownership      (no hook: stopping it releases the remaining classes)
//	final_metrics  the final counters are exported; linger with /metrics up
//
// and then the API stops, and the rest.

// serveAPI serves the OpenAI API until its service stops: after the lame
// duck drained its streams, and its shutdown ends at the lame duck's grace
// deadline (Server.ShutdownBy).
func (r *replica) serveAPI(ctx context.Context) error { return r.fe.Serve(ctx, r.ln) }

// serve marks the replica serving (/readyz succeeds) and reports it ready:
// every other service runs, the registries are loaded and the replica is
// registered.
func (r *replica) serve(context.Context) error {
	r.serving.Store(true)
	if r.ready != nil {
		r.ready(&ReplicaStatus{ID: r.cfg.ID, HTTPAddr: r.httpAddr, GossipAddr: r.gossip.Addr(), actor: r.actor, client: r.client, own: r.own, ix: r.ix, buckets: r.buckets, server: r.server, suspects: r.suspects})
	}
	return nil
}

// drain is the lame duck's first two steps. failed is done once a service
// failed: then nobody is drained for, and the waits are cut.
func (r *replica) drain(failed context.Context) {
	r.stopBegan = time.Now()
	if failed.Err() == nil { // only a replica that served has a lame duck (serve ran)
		r.draining.Store(true)
		close(r.leave)
		r.log.Info("lame duck: readiness failed, handing classes off, still serving", zap.Duration("drain_delay", r.cfg.DrainDelay))
		t := time.NewTimer(r.cfg.DrainDelay)
		select {
		case <-t.C:
		case <-failed.Done():
		}
		t.Stop()
	}
	r.stopping.Store(true)
	// From now on every answer closes its connection: when the listener
	// finally closes, no client is left holding an idle one.
	r.fe.CloseKeepAlives()
	// One grace for the whole stop: what this wait spends, the API's own
	// shutdown (when the api service stops) does not get again.
	graceEnd := time.Now().Add(r.cfg.Frontend.ShutdownGrace)
	r.fe.ShutdownBy(graceEnd)
	idleCtx, cancelIdle := context.WithDeadline(context.Background(), graceEnd)
	if err := r.fe.WaitIdle(idleCtx); err != nil {
		r.log.Warn("requests still in flight after the shutdown grace; cutting them", zap.Duration("grace", r.cfg.Frontend.ShutdownGrace))
	}
	cancelIdle()
	r.client.Leave()
}

// exportFinalMetrics exports the final counters once ownership stopped,
// and lingers (ShutdownLinger) with /metrics up so a scraper sees them.
func (r *replica) exportFinalMetrics(failed context.Context) {
	if r.stopBegan.IsZero() { // stopped before it served: no lame duck ran
		r.stopBegan = time.Now()
		r.stopping.Store(true)
	}
	r.exporter.Observe(admissionSnapshot(flushSoon(r.actor), r.cfg.WorkerType))
	r.exporter.Observe(r.client.Counts(r.cfg.WorkerType))
	r.log.Info("drained: classes handed off, final counters exported", zap.Duration("since_stop", time.Since(r.stopBegan)))
	if failed.Err() == nil && r.cfg.ShutdownLinger > 0 {
		select {
		case <-time.After(r.cfg.ShutdownLinger):
		case <-failed.Done():
		}
	}
}

// flushSoon asks the actor for a fresh snapshot, or returns its last one
// when the actor has stopped.
func flushSoon(a *scheduler.Actor) *scheduler.Snapshot {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if s, err := a.Flush(ctx); err == nil {
		return s
	}
	return a.Snapshot()
}
