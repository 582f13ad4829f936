package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
)

func TestPolynomialMatchesTheDesignFormulas(t *testing.T) {
	p := Polynomial{Speedup: 1}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	assert.InDelta(t, 4.209989e-7*1e6+0.01518344*1000+16.50142, ms(p.StepTime(StepShape{PrefillTokens: 1000})), 1e-6)
	assert.InDelta(t, -25.74*0.25+54.01*0.5+5.74, ms(p.StepTime(StepShape{DecodeTokens: 8, KVUsage: 0.5})), 1e-6)
	mixed := StepShape{PrefillTokens: 500, DecodeTokens: 12, KVUsage: 0.5}
	assert.InDelta(t, PrefillMillis(512)+DecodeMillis(0.5)-DecodeMillis(0), ms(p.StepTime(mixed)), 1e-6)
	assert.Zero(t, p.StepTime(StepShape{}), "an empty step takes no time")
}

func TestSpeedupDividesStepTime(t *testing.T) {
	s := StepShape{PrefillTokens: 2048}
	assert.InDelta(t, float64(Polynomial{Speedup: 1}.StepTime(s))/10, float64(Polynomial{Speedup: 10}.StepTime(s)), 1)
}

func TestRunServesRequestsInRealTimeAndAbortsOnCancel(t *testing.T) {
	cfg := smallConfig()
	step := &switchableTiming{}
	step.d.Store(int64(10 * time.Microsecond))
	cfg.Timing = step
	e, err := New(cfg, clock.Real{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); assert.NoError(t, e.Run(ctx)) }()

	collect := func(s *Stream) []Delta {
		var got []Delta
		for {
			<-s.Notify()
			got = s.Take(got)
			if n := len(got); n > 0 && got[n-1].Finish != 0 {
				return got
			}
		}
	}
	done, err := e.Submit(&Request{ID: "done", Prompt: prompt(1, 50), MaxTokens: 5})
	require.NoError(t, err)
	got := collect(done)
	require.Len(t, got, 5)
	assert.Equal(t, FinishLength, got[4].Finish)

	step.d.Store(int64(time.Hour)) // the next request cannot finish before the cancel
	long, err := e.Submit(&Request{ID: "long", Prompt: prompt(2, 50), MaxTokens: 500})
	require.NoError(t, err)
	cancel()
	wg.Wait()
	got = collect(long)
	assert.Equal(t, FinishAborted, got[len(got)-1].Finish, "Run's exit aborts what is still live")
}

// switchableTiming charges a step time the test can change.
type switchableTiming struct{ d atomic.Int64 }

func (s *switchableTiming) StepTime(StepShape) time.Duration { return time.Duration(s.d.Load()) }
