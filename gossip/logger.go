package gossip

import (
	"bytes"
	"log"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapWriter routes memberlist's log.Logger output into zap. memberlist
// prefixes every line with a level in brackets ("[ERR] memberlist: ..."); the
// writer maps it to a zap level and counts lines by level.
//
// memberlist's Shutdown does not wait for the probe and gossip goroutines
// it started: one may log a line after Run has returned. Once closed is
// set (by Run, after Shutdown) lines are counted but no longer written, so
// a logger whose owner has gone (a test's zaptest logger, a flushed
// production core) is never called after the component stopped.
type zapWriter struct {
	log    *zap.Logger
	count  *prometheus.CounterVec
	closed *atomic.Bool
}

func newMemberlistLogger(l *zap.Logger, count *prometheus.CounterVec, closed *atomic.Bool) *log.Logger {
	return log.New(zapWriter{log: l, count: count, closed: closed}, "", 0)
}

func (w zapWriter) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level, name := zapcore.InfoLevel, "info"
	if len(line) > 0 && line[0] == '[' {
		if end := bytes.IndexByte(line, ']'); end > 0 {
			switch string(line[1:end]) {
			case "DEBUG", "TRACE":
				level, name = zapcore.DebugLevel, "debug"
			case "WARN":
				level, name = zapcore.WarnLevel, "warn"
			case "ERR", "ERROR":
				level, name = zapcore.ErrorLevel, "error"
			}
			line = bytes.TrimSpace(line[end+1:])
		}
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	w.count.WithLabelValues(name).Inc()
	if w.closed.Load() {
		return len(p), nil
	}
	if ce := w.log.Check(level, string(line)); ce != nil {
		ce.Write()
	}
	return len(p), nil
}
