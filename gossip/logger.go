package gossip

import (
	"bytes"
	"log"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapWriter routes memberlist's log.Logger output into zap. memberlist
// prefixes every line with a level in brackets ("[ERR] memberlist: ..."); the
// writer maps it to a zap level and counts lines by level.
type zapWriter struct {
	log   *zap.Logger
	count *prometheus.CounterVec
}

func newMemberlistLogger(l *zap.Logger, count *prometheus.CounterVec) *log.Logger {
	return log.New(zapWriter{log: l, count: count}, "", 0)
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
	if ce := w.log.Check(level, string(line)); ce != nil {
		ce.Write()
	}
	return len(p), nil
}
