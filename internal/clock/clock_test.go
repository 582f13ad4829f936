package clock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func received(c <-chan time.Time) (time.Time, bool) {
	select {
	case at := <-c:
		return at, true
	default:
		return time.Time{}, false
	}
}

func TestAFakeTimerFiresWhenAdvancedToItsDeadlineAndStopsAndResetsLikeTimeTimer(t *testing.T) {
	f := NewFake(t0)
	tm := f.NewTimer(time.Second)
	require.Equal(t, 1, f.Timers())
	f.Advance(999 * time.Millisecond)
	select {
	case <-tm.C():
		t.Fatal("fired early")
	default:
	}
	f.Advance(time.Millisecond)
	require.Equal(t, t0.Add(time.Second), <-tm.C())
	require.Zero(t, f.Timers())

	tm.Reset(time.Minute)
	require.True(t, tm.Stop())
	require.False(t, tm.Stop())
	f.Advance(time.Hour)
	select {
	case <-tm.C():
		t.Fatal("a stopped timer fired")
	default:
	}
	tm.Reset(0)
	<-tm.C() // a non-positive duration fires at once
	at, ok := f.NextTimer()
	require.False(t, ok, "nothing armed, got %v", at)
}

func TestAFakeTickerFiresEveryIntervalAndDropsTheTicksASlowReceiverMissed(t *testing.T) {
	f := NewFake(t0)
	tk := f.NewTicker(time.Second)
	f.Advance(time.Second)
	at, ok := received(tk.C())
	require.True(t, ok)
	require.Equal(t, t0.Add(time.Second), at)

	f.Advance(3500 * time.Millisecond) // ticks at 2 s, 3 s and 4 s: one is kept
	at, ok = received(tk.C())
	require.True(t, ok)
	require.Equal(t, t0.Add(2*time.Second), at, "the buffered tick is the first missed one")
	_, ok = received(tk.C())
	require.False(t, ok, "missed ticks are dropped")
	next, ok := f.NextTimer()
	require.True(t, ok)
	require.Equal(t, t0.Add(5*time.Second), next, "the ticker keeps its phase")

	tk.Stop()
	require.Zero(t, f.Timers())
	f.Advance(time.Hour)
	_, ok = received(tk.C())
	require.False(t, ok, "a stopped ticker does not fire")
}

func TestFakeAfterDeliversAtNowPlusD(t *testing.T) {
	f := NewFake(t0)
	c := f.After(time.Minute)
	f.Set(t0.Add(time.Minute))
	at, ok := received(c)
	require.True(t, ok)
	require.Equal(t, t0.Add(time.Minute), at)
}

func TestTheRealClockSatisfiesClock(t *testing.T) {
	var c Clock = Real{}
	tk := c.NewTicker(time.Millisecond)
	defer tk.Stop()
	<-tk.C()
	<-c.After(time.Millisecond)
	tm := c.NewTimer(time.Hour)
	require.True(t, tm.Stop())
	require.False(t, c.Now().IsZero())
}
