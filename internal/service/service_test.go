package service

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// journal records what the services did, in order.
type journal struct {
	mu     sync.Mutex
	events []string
}

func (j *journal) add(e string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events = append(j.events, e)
}

func (j *journal) get() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.events)
}

// recorded is a service that journals its lifecycle: "start x", "stop x"
// (its Stop hook) and "exit x" (its Run returned).
func recorded(j *journal, name string, deps ...string) Service {
	return Service{
		Name:  name,
		Deps:  deps,
		Start: func(context.Context) error { j.add("start " + name); return nil },
		Run: func(ctx context.Context) error {
			<-ctx.Done()
			j.add("exit " + name)
			return nil
		},
		Stop: func(context.Context) { j.add("stop " + name) },
	}
}

// runAsync runs m until cancel is called; wait returns Run's error.
func runAsync(m *Manager) (cancel context.CancelFunc, wait func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	return cancel, func() error { return <-done }
}

func TestServicesStartInDependencyOrderAndStopInTheReverseOneAfterTheOther(t *testing.T) {
	j := &journal{}
	m, err := New(
		recorded(j, "api", "admission", "index"),
		recorded(j, "session"),
		recorded(j, "admission", "session"),
		recorded(j, "index"),
	)
	require.NoError(t, err)
	require.Equal(t, []string{"session", "admission", "index", "api"}, m.Order(),
		"the declared order where the dependencies allow it")

	cancel, wait := runAsync(m)
	require.Eventually(t, func() bool { return len(j.get()) == 4 }, 5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, wait())
	require.Equal(t, []string{
		"start session", "start admission", "start index", "start api",
		"stop api", "exit api", "stop index", "exit index", "stop admission", "exit admission", "stop session", "exit session",
	}, j.get(), "each service's Stop runs while it still runs, and it has exited before the next one stops")
}

func TestAServicesDependenciesStillRunWhileItStops(t *testing.T) {
	var depRunning, sawDep bool
	var mu sync.Mutex
	m, err := New(
		Service{Name: "dep", Run: func(ctx context.Context) error {
			mu.Lock()
			depRunning = true
			mu.Unlock()
			<-ctx.Done()
			mu.Lock()
			depRunning = false
			mu.Unlock()
			return nil
		}},
		Service{Name: "user", Deps: []string{"dep"}, Stop: func(context.Context) {
			mu.Lock()
			defer mu.Unlock()
			sawDep = depRunning
		}},
	)
	require.NoError(t, err)
	cancel, wait := runAsync(m)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return depRunning }, 5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, wait())
	require.True(t, sawDep, "dep was running during user's Stop")
}

func TestNewRejectsCyclesUnknownDependenciesAndDuplicateNames(t *testing.T) {
	_, err := New(Service{Name: "a", Deps: []string{"b"}}, Service{Name: "b", Deps: []string{"c"}}, Service{Name: "c", Deps: []string{"a"}}, Service{Name: "d"})
	require.ErrorIs(t, err, ErrCycle)
	require.ErrorContains(t, err, "a -> b -> c -> a")

	_, err = New(Service{Name: "a", Deps: []string{"a"}})
	require.ErrorIs(t, err, ErrCycle, "a service depending on itself")

	_, err = New(Service{Name: "a", Deps: []string{"nope"}})
	require.ErrorIs(t, err, ErrUnknownDependency)
	require.ErrorContains(t, err, `a depends on "nope"`)

	_, err = New(Service{Name: "a"}, Service{Name: "a"})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = New(Service{})
	require.ErrorIs(t, err, ErrInvalid)
}

func TestAFailedRunStopsEverythingAtOnceAndItsErrorKeepsTheChain(t *testing.T) {
	j := &journal{}
	boom := make(chan struct{})
	var stopCtxDone []bool
	m, err := New(
		recorded(j, "a"),
		Service{Name: "disk", Deps: []string{"a"}, Run: func(context.Context) error {
			<-boom
			return &fs.PathError{Op: "open", Path: "/x", Err: fs.ErrNotExist}
		}},
		Service{Name: "b", Deps: []string{"disk"}, Stop: func(ctx context.Context) {
			stopCtxDone = append(stopCtxDone, ctx.Err() != nil)
			require.ErrorIs(t, context.Cause(ctx), fs.ErrNotExist, "Stop learns what failed")
		}},
	)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- m.Run(context.Background()) }()
	require.Eventually(t, func() bool { return len(j.get()) == 1 }, 5*time.Second, time.Millisecond)
	close(boom)
	err = <-done
	require.ErrorIs(t, err, fs.ErrNotExist)
	var pe *fs.PathError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "disk: open /x: file does not exist", err.Error())
	require.Equal(t, []bool{true}, stopCtxDone, "the Stop hooks still run, told to skip their waits")
	require.ElementsMatch(t, []string{"start a", "exit a", "stop a"}, j.get(),
		"a was cancelled with everything else at once, and its hook still ran")
}

func TestAFailedStartStopsTheStartedServicesAndStartsNoMore(t *testing.T) {
	j := &journal{}
	m, err := New(
		recorded(j, "a"),
		Service{Name: "join", Deps: []string{"a"}, Start: func(context.Context) error { return fs.ErrPermission },
			Stop: func(context.Context) { j.add("stop join") }},
		recorded(j, "later", "join"),
	)
	require.NoError(t, err)
	err = m.Run(context.Background())
	require.ErrorIs(t, err, fs.ErrPermission)
	require.Equal(t, "join: permission denied", err.Error())
	require.ElementsMatch(t, []string{"start a", "exit a", "stop a"}, j.get(), "join never started, so it is not stopped; later never starts")
}

func TestStoppingDuringAStartInterruptsItAndStopsWhatHadStarted(t *testing.T) {
	j := &journal{}
	waiting := make(chan struct{})
	m, err := New(
		recorded(j, "a"),
		Service{Name: "join", Deps: []string{"a"}, Start: func(ctx context.Context) error {
			close(waiting)
			<-ctx.Done() // say, a lease that never comes
			return ctx.Err()
		}, Stop: func(context.Context) { j.add("stop join") }},
		recorded(j, "later", "join"),
	)
	require.NoError(t, err)
	cancel, wait := runAsync(m)
	<-waiting
	cancel()
	require.NoError(t, wait(), "an interrupted start is no failure")
	require.Equal(t, []string{"start a", "stop a", "exit a"}, j.get())
}

func TestAStartThatFailsWithCanceledOnItsOwnIsStillAFailure(t *testing.T) {
	m, err := New(Service{Name: "odd", Start: func(context.Context) error { return context.Canceled }})
	require.NoError(t, err)
	require.ErrorIs(t, m.Run(context.Background()), context.Canceled)
}

func TestARunThatEndsOnItsOwnEndsOnlyItself(t *testing.T) {
	j := &journal{}
	m, err := New(
		Service{Name: "once", Run: func(context.Context) error { j.add("exit once"); return nil }},
		Service{Name: "quitter", Run: func(context.Context) error { j.add("exit quitter"); return context.Canceled }},
		recorded(j, "b", "once", "quitter"),
	)
	require.NoError(t, err)
	synctest.Test(t, func(t *testing.T) {
		cancel, wait := runAsync(m)
		synctest.Wait() // every goroutine is blocked: nothing more will happen by itself
		require.ElementsMatch(t, []string{"exit once", "exit quitter", "start b"}, j.get(), "b keeps running")
		cancel()
		require.NoError(t, wait())
		require.Equal(t, []string{"stop b", "exit b"}, j.get()[3:])
	})
}

func TestAFailureDuringAStopHookCutsItsWaitShort(t *testing.T) {
	boom, running := make(chan struct{}), make(chan struct{})
	m, err := New(
		Service{Name: "flaky", Run: func(ctx context.Context) error {
			close(running)
			select {
			case <-boom:
				return errors.New("lost the connection")
			case <-ctx.Done():
				return nil
			}
		}},
		Service{Name: "drain", Deps: []string{"flaky"}, Stop: func(ctx context.Context) {
			close(boom)
			select {
			case <-ctx.Done(): // the failure
			case <-time.After(time.Minute):
				t.Error("the drain was not cut short")
			}
		}},
	)
	require.NoError(t, err)
	cancel, wait := runAsync(m)
	<-running
	cancel()
	require.EqualError(t, wait(), "flaky: lost the connection", "a failure while stopping is still reported")
}

func TestAServiceSlowToStopHoldsUpTheOthersOnlyForItsStopTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var depExited, slowExited time.Duration
		start := time.Now()
		m, err := New(
			Service{Name: "dep", Run: func(ctx context.Context) error {
				<-ctx.Done()
				depExited = time.Since(start)
				return nil
			}},
			Service{Name: "slow", Deps: []string{"dep"}, StopTimeout: 2 * time.Second, Run: func(ctx context.Context) error {
				<-ctx.Done()
				time.Sleep(5 * time.Second) // ignores its stop for a while
				slowExited = time.Since(start)
				return nil
			}},
		)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.NoError(t, m.Run(ctx))
		require.Zero(t, depExited, "nothing started: ctx had ended already")
		require.Zero(t, slowExited)

		start = time.Now()
		ctx, cancel = context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		synctest.Wait()
		cancel()
		require.NoError(t, <-done)
		require.Equal(t, 2*time.Second, depExited, "dep stopped once slow's StopTimeout ran out")
		require.Equal(t, 5*time.Second, slowExited, "Run returned only after slow exited")
	})
}
