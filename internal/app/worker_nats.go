package app

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/wire"
)

// kvEventPublisher publishes the engine's KV event batches. The engine calls it with
// its lock held; nats.go's Publish only appends to the connection's buffer
// (its own goroutine writes to the socket), so the step is not held up by
// the network. A failed publish is counted: consumers see the id gap and
// repair from a dump.
type kvEventPublisher struct {
	w   *worker
	buf []byte // reused: Publish copies the payload into the connection buffer
}

func (s *kvEventPublisher) PublishKVEvents(b *wire.KVEventBatch) {
	b.TimeUnixNano = time.Now().UnixNano() // lets routers measure event lag
	s.buf = wire.AppendKVEventBatch(s.buf[:0], b)
	if err := s.w.nc.Publish(s.w.subjects.KV(s.w.cfg.ID), s.buf); err != nil {
		s.w.metrics.publishErrors.WithLabelValues("kv").Inc()
		return
	}
	s.w.metrics.kvBatches.Inc()
}

// answerDump replies to a dump request with the engine's block set in
// chunks on the request's reply subject. It runs on nats.go's subscription
// goroutine.
func (w *worker) answerDump(msg *nats.Msg) {
	req, err := wire.DecodeKVDumpRequest(msg.Data)
	if err == nil && msg.Reply == "" {
		err = wire.ErrMalformed
	}
	if err != nil {
		w.metrics.malformed.WithLabelValues("kv_dump_request").Inc()
		w.log.Warn("malformed kv dump request", zap.Error(err))
		return
	}
	per := w.cfg.DumpChunkBlocks
	if req.MaxBlocksPerChunk > 0 && req.MaxBlocksPerChunk < per {
		per = req.MaxBlocksPerChunk
	}
	d := w.eng.Dump()
	var buf []byte
	for seq, off := uint32(0), 0; ; seq++ {
		end := min(off+per, len(d.Hashes))
		c := wire.KVDumpChunk{Worker: d.Worker, Instance: d.Instance, AsOfID: d.AsOfID, Seq: seq,
			Final: end == len(d.Hashes), Hashes: d.Hashes[off:end]}
		buf = wire.AppendKVDumpChunk(buf[:0], &c)
		if err := w.nc.Publish(msg.Reply, buf); err != nil {
			w.metrics.publishErrors.WithLabelValues("kv_dump").Inc()
			w.log.Warn("publish kv dump chunk", zap.Error(err))
			return
		}
		if c.Final {
			break
		}
		off = end
	}
	w.metrics.dumps.Inc()
}

// reportLoad publishes a LoadReport every LoadInterval and, at most every
// LoadMinInterval, when the engine's running or waiting count changes.
func (w *worker) reportLoad(ctx context.Context) {
	tick := time.NewTicker(w.cfg.LoadInterval)
	defer tick.Stop()
	var seq uint64
	var last time.Time
	subject := w.subjects.Load(w.cfg.ID)
	publish := func() {
		st := w.eng.Stats()
		seq++
		r := &wire.LoadReport{Worker: w.cfg.ID, Instance: st.Instance, Seq: seq,
			Running: st.Running, Waiting: st.Waiting, KVUsage: st.KVUsage,
			KVBlocksUsed: st.KVBlocksUsed, KVBlocksTotal: st.KVBlocksTotal,
			PrefixHitRate: st.PrefixHitRate, LastEventID: st.LastEventID,
			TimeUnixNano: time.Now().UnixNano()}
		if err := w.nc.Publish(subject, wire.EncodeLoadReport(r)); err != nil {
			w.metrics.publishErrors.WithLabelValues("load").Inc()
			return
		}
		w.metrics.loadReports.Inc()
		last = time.Now()
	}
	publish()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			publish()
		case <-w.eng.Changed():
			if time.Since(last) >= w.cfg.LoadMinInterval {
				publish()
			} // else the next tick carries the change
		}
	}
}
