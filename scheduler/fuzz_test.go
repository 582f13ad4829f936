package scheduler

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
)

func FuzzDecodePolicy(f *testing.F) {
	for _, s := range []string{"fcfs", "LCFS", " wspt ", "", "fifo", "policy(9)", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePolicy(s)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidConfig)
			return
		}
		again, err := ParsePolicy(p.String())
		require.NoError(t, err, "a parsed policy's name parses")
		require.Equal(t, p, again)
	})
}

func FuzzDecodeReason(f *testing.F) {
	for _, r := range Reasons {
		f.Add(r.String())
	}
	f.Add("reason(0)")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseReason(s)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidConfig)
			return
		}
		require.Equal(t, s, r.String())
		require.ErrorIs(t, Reject(r, "", ""), r.sentinel(), "every reason unwraps to its sentinel")
	})
}

// FuzzEnqueue feeds arbitrary requests to a Core: nothing panics and every
// request is completed exactly once (at once, or after Cancel).
func FuzzEnqueue(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte("\xff\xff\xff\xff\xff\xff\xff\xff\x80\x00\x00\x00pinned-and-allowed"))
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, data []byte) {
		clock := clock.NewFake(t0)
		c := NewCore(DefaultConfig(), clock, nil, rand.New(rand.NewPCG(1, 1)))
		ws := workers(3, 1)
		ws[2].BlockSize = 1
		c.SetWorkers(ws)
		zero := classCfg("zero", PolicyWSPT)
		zero.Limits.CachedTokens = 0
		limited := classCfg("limited", PolicyLCFS)
		limited.Limits = Limits{Requests: 1, ISLTokens: 100, CachedTokens: 10}
		c.SetClasses([]ClassConfig{classCfg("c", PolicyFCFS), zero, limited})

		next := func(n int) uint64 {
			if len(data) < n {
				data = append(data, make([]byte, n-len(data))...)
			}
			var buf [8]byte
			copy(buf[:], data[:n])
			data = data[n:]
			return binary.LittleEndian.Uint64(buf[:])
		}
		calls := map[string]int{}
		var queued []string
		for i := 0; len(data) > 0 && i < 16; i++ {
			names := []string{"c", "zero", "limited", "x"}
			wk := []string{"w0", "w1", "w2", "ghost", ""}
			r := &Request{
				ID:             string(rune('a' + next(1)%4)),
				Class:          names[next(1)%4],
				StrictPriority: int32(next(4)),
				PriorityJump:   math.Float64frombits(next(8)),
				Ingress:        t0.Add(time.Duration(int64(next(8)))),
				PromptTokens:   int(int32(next(4))),
				Pinned:         wk[next(1)%5],
				Attempt:        int(next(1)%3) - 1,
				Probe:          next(1)%5 == 0,
			}
			if d := next(1); d%3 == 0 {
				r.Due = t0.Add(time.Duration(int8(d)) * time.Second)
			}
			for range next(1) % 4 {
				r.Overlaps = append(r.Overlaps, Overlap{Worker: wk[next(1)%5], Blocks: int(int16(next(2)))})
			}
			for range next(1) % 4 {
				r.Allowed = append(r.Allowed, wk[next(1)%5])
			}
			r.BlockHashes = seqHashes(next(1), int(next(1)%40))
			key := string(rune('0'+i)) + r.ID
			calls[key] = 0
			c.Enqueue(r, func(Grant, error) bool { calls[key]++; return next(1)%7 != 0 })
			if calls[key] == 0 {
				queued = append(queued, r.ID)
			}
			clock.Advance(time.Duration(next(1)) * 100 * time.Millisecond)
			c.Tick()
		}
		for _, id := range queued {
			c.Cancel(id)
		}
		require.Zero(t, c.Queued())
		for key, n := range calls {
			require.Equalf(t, 1, n, "request %s completed %d times", key, n)
		}
	})
}
