package metrics

import "time"

// Clock makes the tickers the Exporter's periodic pull waits on. Production
// uses RealClock; tests inject a ticker they fire by hand, so no test waits on
// wall time.
type Clock interface {
	NewTicker(d time.Duration) Ticker
}

// Ticker is the subset of *time.Ticker the Exporter uses.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// RealClock returns a Clock backed by time.NewTicker.
func RealClock() Clock { return realClock{} }

type realClock struct{}

func (realClock) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }
