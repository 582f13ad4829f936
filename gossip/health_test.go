package gossip

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func TestAWorkerIsSuspectUntilTheTTLOrANewerRecovery(t *testing.T) {
	at := time.Unix(100, 0)
	ttl := 10 * time.Second
	since := at.UnixNano()
	for name, c := range map[string]struct {
		h    Health
		now  time.Time
		want bool
	}{
		"no record":                  {Health{}, at, false},
		"fresh suspicion":            {Health{SuspectSince: since}, at.Add(time.Second), true},
		"expired suspicion":          {Health{SuspectSince: since}, at.Add(ttl), false},
		"recovered after suspicion":  {Health{SuspectSince: since, RecoveredAt: since + 1}, at.Add(time.Second), false},
		"suspected again after that": {Health{SuspectSince: since + 2, RecoveredAt: since + 1}, at.Add(time.Second), true},
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, c.want, c.h.Suspected(c.now, ttl))
		})
	}
	require.Equal(t, Health{SuspectSince: 5, RecoveredAt: 7}, Health{SuspectSince: 5, RecoveredAt: 1}.Join(Health{SuspectSince: 2, RecoveredAt: 7}))
}

func TestAVersionTwoMessageIsStillReadWithoutHealth(t *testing.T) {
	m := &loadsMsg{Origin: "r1", Version: 9, Timestamp: 1, Entries: []workerEntry{{Worker: "w", Entry: Entry{Version: 9, Load: WorkerLoad{ActiveRequests: 2}}}}}
	b := appendLoads(nil, m)
	// A version 2 entry is a version 3 one without its two health varints
	// (here two zero bytes at the end).
	v2 := append([]byte{}, b[:len(b)-2]...)
	v2[2] = 2
	kind, out, _, _, err := decodeMessage(v2)
	require.NoError(t, err)
	require.Equal(t, kindLoads, kind)
	require.Equal(t, m, out)
	_, _, _, _, err = decodeMessage(append([]byte{'S', 'G', 1}, b[3:]...))
	require.ErrorIs(t, err, ErrVersion, "version 1 is still refused")
}

func TestASuspicionAtOneReplicaReachesEveryOther(t *testing.T) {
	rs := startCluster(t, 3, nil)
	since := time.Now().UnixNano()
	rs[0].SetLocalHealth(map[string]Health{"w1": {SuspectSince: since}})
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, r := range rs {
			if !r.Health("w1").Suspected(time.Unix(0, since), time.Minute) {
				return false
			}
		}
		return true
	}, "every replica, r0 included, sees r0's suspicion of w1")

	rs[1].SetLocalHealth(map[string]Health{"w1": {RecoveredAt: since + 1}})
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, r := range rs {
			if h := r.Health("w1"); h != (Health{SuspectSince: since, RecoveredAt: since + 1}) {
				return false
			}
		}
		return true
	}, "r1's later recovery of w1 reaches every replica and ends the suspicion")
	require.Contains(t, rs[2].HealthRecords(), "w1")
}
