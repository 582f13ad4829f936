package scheduler

import (
	"errors"
	"flag"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
)

func TestRejectErrorsMatchTheirSentinelsWithErrorsIs(t *testing.T) {
	want := map[Reason]error{
		ReasonDueTimePassed: ErrDeadlineExceeded, ReasonPredictedMiss: ErrPredictedMiss,
		ReasonQueueFull: ErrQueueFull, ReasonNoEndpoints: ErrNoEndpoints, ReasonOverloaded: ErrOverloaded,
		ReasonOwnershipLost: ErrOwnershipMoved, ReasonInvalidConstraint: ErrInvalidConstraint,
		ReasonUnknownClass: ErrUnknownClass, ReasonQuotaExceeded: ErrQuotaExceeded,
	}
	require.Len(t, Reasons, len(want))
	for _, r := range Reasons {
		err := Reject(r, "", "detail")
		require.ErrorIs(t, err, want[r], r.String())
		require.Equal(t, r, ReasonOf(err))
		wrapped := errors.Join(errors.New("context"), err)
		require.ErrorIs(t, wrapped, want[r])
	}
	require.Zero(t, ReasonOf(errors.New("other")))
	require.Equal(t, "rejected: queue_full (limit requests): full", Reject(ReasonQueueFull, LimitRequests, "full").Error())
}

func TestReasonStringsAreTheMetricLabels(t *testing.T) {
	labels := []string{"due_time_passed", "predicted_miss", "queue_full", "no_endpoints",
		"overloaded", "ownership_lost", "invalid_constraint", "unknown_class", "quota_exceeded"}
	for i, r := range Reasons {
		require.Equal(t, labels[i], r.String())
		back, err := ParseReason(labels[i])
		require.NoError(t, err)
		require.Equal(t, r, back)
		require.Equal(t, i+1, int(r), "enums start at one")
	}
	_, err := ParseReason("nope")
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestPoliciesParseByNameAndStartAtOne(t *testing.T) {
	for want, name := range map[Policy]string{PolicyFCFS: "fcfs", PolicyLCFS: "lcfs", PolicyWSPT: "wspt"} {
		p, err := ParsePolicy(name)
		require.NoError(t, err)
		require.Equal(t, want, p)
		require.Equal(t, name, p.String())
	}
	require.Equal(t, Policy(1), PolicyFCFS)
	_, err := ParsePolicy("edf")
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestConfigValidateNamesTheBadField(t *testing.T) {
	require.NoError(t, DefaultConfig().Validate())
	cases := map[string]func(*Config){
		"OverlapCredit":    func(c *Config) { c.OverlapCredit = math.NaN() },
		"PrefillScale":     func(c *Config) { c.PrefillScale = -1 },
		"Temperature":      func(c *Config) { c.Temperature = math.Inf(1) },
		"AckTimeout":       func(c *Config) { c.AckTimeout = 0 },
		"BookingExpiry":    func(c *Config) { c.BookingExpiry = -time.Second },
		"SnapshotInterval": func(c *Config) { c.SnapshotInterval = 0 },
	}
	for field, mutate := range cases {
		c := DefaultConfig()
		mutate(&c)
		err := c.Validate()
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, field)
	}
}

func TestConfigFlagsOverrideDefaults(t *testing.T) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c.RegisterFlags(fs, "scheduler.")
	require.NoError(t, fs.Parse([]string{"-scheduler.temperature=0.5", "-scheduler.ack-timeout=5s"}))
	require.Equal(t, 0.5, c.Temperature)
	require.Equal(t, 5*time.Second, c.AckTimeout)
	require.Equal(t, DefaultConfig().BookingExpiry, c.BookingExpiry)
}

func TestClassConfigValidateNamesTheBadField(t *testing.T) {
	require.NoError(t, classCfg("c", PolicyWSPT).Validate())
	cases := map[string]func(*ClassConfig){
		"name":               func(c *ClassConfig) { c.Name = "" },
		"Quantum":            func(c *ClassConfig) { c.Quantum = 0 },
		"Policy":             func(c *ClassConfig) { c.Policy = 0 },
		"Limits.Requests":    func(c *ClassConfig) { c.Limits.Requests = -2 },
		"Limits.ISLTokens":   func(c *ClassConfig) { c.Limits.ISLTokens = -5 },
		"Limits.CachedToken": func(c *ClassConfig) { c.Limits.CachedTokens = -3 },
		"BusyPrefillTokens":  func(c *ClassConfig) { c.BusyPrefillTokens = -1 },
		"BusyDecodeFraction": func(c *ClassConfig) { c.BusyDecodeFraction = math.NaN() },
	}
	for field, mutate := range cases {
		c := classCfg("c", PolicyFCFS)
		mutate(&c)
		err := c.Validate()
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, field)
	}
}

func TestInvalidWorkerRegistrationsAreSkippedAndCounted(t *testing.T) {
	h := newHarness(t, []Worker{{ID: "ok", BlockSize: 16}, {ID: "", BlockSize: 16}, {ID: "zero-block"}},
		classCfg("c", PolicyFCFS))
	require.Equal(t, []Worker{{ID: "ok", BlockSize: 16}}, h.core.Workers())
	require.Equal(t, uint64(2), h.core.Snapshot().InvalidConfigs)
	require.ErrorContains(t, Worker{ID: "w", BlockSize: 16, MaxRunning: -1}.Validate(), "MaxRunning")
}

func TestRequestMethodsAreTheSingleSourceOfCacheArithmetic(t *testing.T) {
	r := &Request{PromptTokens: 100, BlockHashes: seqHashes(1, 6), ExpectedOutputTokens: 40,
		Overlaps: []Overlap{{Worker: "a", Blocks: 9}, {Worker: "b", Blocks: 2}}, Allowed: []string{"b", "c"}}
	require.Equal(t, 6, r.OverlapBlocks("a"), "overlap is capped to the prompt's full blocks")
	require.Equal(t, 96, r.CachedTokens("a", 16))
	require.Equal(t, 4, r.PrefillTokens("a", 16))
	require.Equal(t, 0, r.OverlapBlocks("z"))
	require.Equal(t, 7, r.BlockCount(16), "six full blocks and a partial tail")
	require.Equal(t, 3, r.privateBlocks(16), "ceil(140/16)=9 blocks, 6 of them hashed")
	require.True(t, r.Allows("c"))
	require.False(t, r.Allows("a"))
	ws := []Worker{{ID: "a", BlockSize: 16}, {ID: "b", BlockSize: 16}}
	require.Equal(t, 32, r.BestCachedTokens(ws), "a is not allowed: the best allowed is b")
	r.Pinned = "a"
	require.Equal(t, 96, r.BestCachedTokens(ws), "pinned uses the pinned worker")
}

// versionedView counts RemoteLoad calls.
type versionedView struct {
	version uint64
	load    WorkerLoad
	calls   int
}

func (v *versionedView) RemoteLoad(string) WorkerLoad { v.calls++; return v.load }
func (v *versionedView) LoadVersion() uint64          { return v.version }

func TestVersionedLoadViewIsReadAgainOnlyWhenItsVersionChanges(t *testing.T) {
	view := &versionedView{version: 1}
	c := NewCore(DefaultConfig(), clock.NewFake(t0), view, nil)
	c.SetWorkers(workers(4, 2))
	c.SetClasses([]ClassConfig{classCfg("c", PolicyFCFS)})
	ok := func(Grant, error) bool { return true }
	c.Enqueue(req("a", "c", 10), ok)
	c.Enqueue(req("b", "c", 10), ok)
	require.Equal(t, 4, view.calls, "one refresh of four workers serves both selections")

	view.version, view.load = 2, WorkerLoad{ActiveRequests: 2} // every worker now full remotely
	got := errors.New("not answered")
	c.Enqueue(req("c", "c", 10), func(_ Grant, err error) bool { got = err; return true })
	require.Equal(t, 8, view.calls)
	require.EqualError(t, got, "not answered", "the remote load keeps the request queued")
	require.Equal(t, 1, c.Queued())
}
