package gossip

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func sampleSession() *sessionMsg {
	return &sessionMsg{Origin: "r1", ID: 9, Timestamp: 1_700_000_000_000, Session: 1 << 63, Worker: "w-a", Expires: 1_700_000_600_000}
}

func TestSessionMessageRoundTrips(t *testing.T) {
	in := sampleSession()
	b := appendSession(nil, in)
	require.True(t, isSessionMessage(b))
	out, err := decodeSession(b)
	require.NoError(t, err)
	require.Equal(t, in, out)
}

func TestSessionDecoderRejectsCorruptInputWithTypedErrors(t *testing.T) {
	good := appendSession(nil, sampleSession())
	noWorker := *sampleSession()
	noWorker.Worker = ""
	for name, c := range map[string]struct {
		in   []byte
		want error
	}{
		"empty":          {nil, ErrForeign},
		"future version": {append([]byte{'S', 'G', 9}, good[3:]...), ErrVersion},
		"loads message":  {appendLoads(nil, sampleLoads()), ErrMalformed},
		"truncated":      {good[:len(good)-1], ErrMalformed},
		"trailing byte":  {append(append([]byte{}, good...), 0), ErrMalformed},
		"no worker":      {appendSession(nil, &noWorker), ErrMalformed},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := decodeSession(c.in)
			require.ErrorIs(t, err, c.want)
		})
	}
}

func TestTheGeneralDecoderRejectsASessionMessageAsAnUnknownKind(t *testing.T) {
	// What a replica of the previous release does with one: counted, and
	// its loads keep flowing.
	_, _, _, _, err := decodeMessage(appendSession(nil, sampleSession()))
	require.ErrorIs(t, err, ErrMalformed)
}

func FuzzDecodeSession(f *testing.F) {
	f.Add(appendSession(nil, sampleSession()))
	f.Add([]byte{'S', 'G', codecVersion, byte(kindSession)})
	f.Add(appendPrediction(nil, samplePrediction()))
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := decodeSession(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrForeign) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		m2, err := decodeSession(appendSession(nil, m))
		require.NoError(t, err, "a decoded message re-encodes to one that decodes")
		require.Equal(t, m, m2)
	})
}

type sessionCall struct {
	session     uint64
	worker      string
	at, expires time.Time
}

type sessionRecorder struct {
	mu    sync.Mutex
	calls []sessionCall
}

func (s *sessionRecorder) sink(session uint64, worker string, at, expires time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, sessionCall{session, worker, at, expires})
}

func (s *sessionRecorder) snapshot() []sessionCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sessionCall(nil), s.calls...)
}

func TestASessionRoutedAtOneReplicaReachesEveryOtherReplicaOnce(t *testing.T) {
	rs := startCluster(t, 3, nil)
	recs := make([]*sessionRecorder, len(rs))
	for i, r := range rs {
		recs[i] = &sessionRecorder{}
		r.SetSessionSink(recs[i].sink)
	}
	before := time.Now()
	rs[0].ShareSession(42, "w3", time.Minute)
	for _, i := range []int{1, 2} {
		testenv.Eventually(t, 20*time.Second, func() bool { return len(recs[i].snapshot()) > 0 }, "r%d learns the session", i)
		calls := recs[i].snapshot()
		require.Len(t, calls, 1, "delivered once despite relays")
		require.Equal(t, uint64(42), calls[0].session)
		require.Equal(t, "w3", calls[0].worker)
		require.False(t, calls[0].at.Before(before.Add(-time.Second)), "carries the routing time")
		require.True(t, calls[0].expires.After(before.Add(50*time.Second)), "expiry carries the ttl")
	}
	require.Empty(t, recs[0].snapshot(), "the routing replica's own sink is not called")
}

func TestShareSessionDropsAndCountsWhenItsQueueIsFull(t *testing.T) {
	g := newIdle(t, func(c *Config) { c.PredictionQueueSize = 1 })
	g.ShareSession(1, "w", time.Second)
	g.ShareSession(2, "w", time.Second)
	require.Equal(t, 1.0, counter(t, g.m.dropped.WithLabelValues(dropSessionFull)))
}

func TestAMalformedSessionMessageIsCountedAndNeverReachesTheOwner(t *testing.T) {
	g := newIdle(t, nil)
	good := appendSession(nil, sampleSession())
	g.delegate.NotifyMsg(good[:len(good)-2])
	require.Equal(t, 1.0, counter(t, g.m.decodeErrors.WithLabelValues("message")))
	require.Empty(t, g.inbox)
	g.delegate.NotifyMsg(good)
	require.Len(t, g.inbox, 1)
}
