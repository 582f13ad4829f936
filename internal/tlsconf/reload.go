package tlsconf

import (
	"crypto/sha256"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"
)

// Metrics counts reloads of TLS material, by link name and result
// (reloaded, failed). One per process: NewMetrics registers the series.
type Metrics struct {
	reloads *prometheus.CounterVec
}

// NewMetrics registers switchyard_tls_reloads_total on reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	return &Metrics{reloads: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_tls_reloads_total",
		Help: "Changes of TLS certificate, key or CA files seen, by link and result (reloaded: in use from the next handshake; failed: the previous material stays).",
	}, []string{"link", "result"})}
}

func (m *Metrics) count(link, result string) {
	if m != nil {
		m.reloads.WithLabelValues(link, result).Inc()
	}
}

// source holds the material parsed from a set of files and re-parses it
// when their contents change, at most once per interval.
type source[T any] struct {
	paths    []string
	parse    func([][]byte) (T, error)
	d        Deps
	mu       sync.Mutex
	checked  time.Time
	sum      [sha256.Size]byte
	badSum   [sha256.Size]byte // contents that failed to parse: not retried or logged again
	cur      T
	interval time.Duration
}

// newSource reads and parses the files once; an error here fails Build.
func newSource[T any](paths []string, d Deps, parse func([][]byte) (T, error)) (*source[T], error) {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Logger == nil {
		d.Logger = zap.NewNop()
	}
	s := &source[T]{paths: paths, parse: parse, d: d, interval: d.CheckInterval}
	if s.interval <= 0 {
		s.interval = DefaultCheckInterval
	}
	b, sum, err := s.read()
	if err != nil {
		return nil, fmt.Errorf("tlsconf: %w", err)
	}
	cur, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: %w", err)
	}
	s.cur, s.sum, s.checked = cur, sum, d.Now()
	return s, nil
}

func (s *source[T]) read() ([][]byte, [sha256.Size]byte, error) {
	h := sha256.New()
	out := make([][]byte, len(s.paths))
	for i, p := range s.paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, [sha256.Size]byte{}, err
		}
		out[i] = b
		// Length-prefixed, so moving bytes between files changes the sum.
		_, _ = fmt.Fprintf(h, "%d:", len(b))
		_, _ = h.Write(b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return out, sum, nil
}

// get returns the current material, re-reading the files first when the
// interval has passed since the last look. A failed read or parse keeps the
// current material (counted, logged) and is retried at the next look.
func (s *source[T]) get() T {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.d.Now()
	if now.Sub(s.checked) < s.interval {
		return s.cur
	}
	s.checked = now
	b, sum, err := s.read()
	if err == nil && (sum == s.sum || sum == s.badSum) {
		return s.cur
	}
	var next T
	if err == nil {
		if next, err = s.parse(b); err != nil {
			s.badSum = sum
		}
	}
	if err != nil {
		s.d.Metrics.count(s.d.Name, "failed")
		s.d.Logger.Warn("TLS files changed but do not load; keeping the previous ones",
			zap.String("link", s.d.Name), zap.Strings("files", s.paths), zap.Error(err))
		return s.cur
	}
	s.cur, s.sum = next, sum
	s.d.Metrics.count(s.d.Name, "reloaded")
	s.d.Logger.Info("TLS files reloaded", zap.String("link", s.d.Name), zap.Strings("files", s.paths))
	return s.cur
}
