package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

var (
	// ErrCycle is returned by New when services depend on each other in a
	// cycle; the error names it.
	ErrCycle = errors.New("service: dependency cycle")
	// ErrUnknownDependency is returned by New when a service depends on a
	// name no service has.
	ErrUnknownDependency = errors.New("service: unknown dependency")
	// ErrInvalid is returned by New for a service without a name or with a
	// name another service has.
	ErrInvalid = errors.New("service: invalid service")
)

// Service is one long-running part of a process. Every field but Name is
// optional.
type Service struct {
	// Name identifies the service in Deps and prefixes its errors.
	Name string
	// Deps names the services that must be started before this one and
	// stopped after it.
	Deps []string
	// Start prepares the service and returns once the services that
	// depend on it may start (a registry loaded, a record written). Its
	// context ends when the manager is told to stop or a service fails;
	// Start then returns that context's error and the service counts as
	// never started: neither Run nor Stop is called.
	Start func(ctx context.Context) error
	// Run runs the service until ctx ends, then returns nil. Returning nil
	// earlier ends this service alone; an error stops the manager. Without
	// Run the service only has its hooks, and runs until it is stopped.
	Run func(ctx context.Context) error
	// Stop is the service's graceful phase: called when the manager stops
	// this service, while its Run still runs and before its context is
	// cancelled; every service it depends on still runs. Its context is
	// done once any service has failed (context.Cause tells which): Stop
	// then skips or cuts its waits.
	Stop func(ctx context.Context)
	// StopTimeout bounds how long the manager waits for Run to return,
	// once its context is cancelled, before it goes on stopping the
	// services this one depends on (0: as long as it takes). Run is still
	// awaited before Manager.Run returns.
	StopTimeout time.Duration
}

// Failure is what err, returned by the long-running part called name, means
// to the parts running beside it: nil for nil or a cancellation (the part
// was stopped; it did not fail), else "name: err" with err's chain kept, so
// errors.Is and errors.As see through it.
func Failure(name string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return fmt.Errorf("%s: %w", name, err)
}

// Manager starts services in dependency order and stops them in reverse.
type Manager struct {
	order []Service // start order
}

// New checks the services' dependencies and fixes the order they start in:
// the declared order, except that a service comes after everything it
// depends on.
func New(services ...Service) (*Manager, error) {
	byName := make(map[string]int, len(services))
	for i, s := range services {
		if s.Name == "" {
			return nil, fmt.Errorf("%w: service %d has no name", ErrInvalid, i)
		}
		if _, dup := byName[s.Name]; dup {
			return nil, fmt.Errorf("%w: two services named %q", ErrInvalid, s.Name)
		}
		byName[s.Name] = i
	}
	for _, s := range services {
		for _, d := range s.Deps {
			if _, ok := byName[d]; !ok {
				return nil, fmt.Errorf("%w: %s depends on %q", ErrUnknownDependency, s.Name, d)
			}
		}
	}
	started := make([]bool, len(services))
	order := make([]Service, 0, len(services))
	for len(order) < len(services) {
		next := -1
		for i, s := range services {
			if !started[i] && all(s.Deps, func(d string) bool { return started[byName[d]] }) {
				next = i
				break
			}
		}
		if next < 0 {
			return nil, fmt.Errorf("%w: %s", ErrCycle, strings.Join(findCycle(services, byName, started), " -> "))
		}
		started[next] = true
		order = append(order, services[next])
	}
	return &Manager{order: order}, nil
}

func all(names []string, ok func(string) bool) bool {
	for _, n := range names {
		if !ok(n) {
			return false
		}
	}
	return true
}

// findCycle returns a dependency cycle among the services not yet ordered,
// its first service repeated at its end.
func findCycle(services []Service, byName map[string]int, ordered []bool) []string {
	const (
		unseen = iota
		onPath
		finished
	)
	state := make([]int, len(services))
	var path []string
	var visit func(i int) []string
	visit = func(i int) []string {
		state[i] = onPath
		path = append(path, services[i].Name)
		for _, d := range services[i].Deps {
			j := byName[d]
			switch {
			case ordered[j] || state[j] == finished:
			case state[j] == onPath:
				from := len(path) - 1
				for path[from] != d {
					from--
				}
				return append(append([]string(nil), path[from:]...), d)
			default:
				if c := visit(j); c != nil {
					return c
				}
			}
		}
		state[i] = finished
		path = path[:len(path)-1]
		return nil
	}
	for i := range services {
		if !ordered[i] && state[i] == unseen {
			if c := visit(i); c != nil {
				return c
			}
		}
	}
	return nil // unreachable: New found no service to order
}

// Order is the names of the services in the order they start; they stop in
// the reverse.
func (m *Manager) Order() []string {
	out := make([]string, len(m.order))
	for i, s := range m.order {
		out[i] = s.Name
	}
	return out
}

// unit is a started service.
type unit struct {
	svc    Service
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
}

// Run starts the services in order and runs them until ctx ends or one of
// them fails, then stops the started ones in reverse order. It returns only
// after every Run has returned: nil when ctx ended, else the first failure.
// The services' contexts do not derive from ctx's cancellation (its values
// they keep): ending ctx begins the ordered stop, it does not cut
// everything at once. Run may be called once.
func (m *Manager) Run(ctx context.Context) error {
	// base parents every service's context; cancelling it stops them all
	// at once, which only a failure does.
	base, cancelAll := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelAll()
	failed, fail := context.WithCancelCause(context.Background())
	defer fail(nil)
	report := func(name string, err error) {
		if err = Failure(name, err); err != nil {
			fail(err)
			cancelAll()
		}
	}

	var started []*unit
	for _, s := range m.order {
		if ctx.Err() != nil || failed.Err() != nil {
			break
		}
		uctx, cancel := context.WithCancel(base)
		if s.Start != nil {
			sctx, cancelStart := context.WithCancel(uctx)
			stopStart := context.AfterFunc(ctx, cancelStart)
			err := s.Start(sctx)
			stopStart()
			cancelStart()
			if err != nil {
				if ctx.Err() == nil && failed.Err() == nil {
					// Not interrupted: a failure, even one that says
					// "cancelled".
					fail(fmt.Errorf("%s: %w", s.Name, err))
					cancelAll()
				}
				cancel()
				break
			}
		}
		u := &unit{svc: s, cancel: cancel, done: make(chan struct{})}
		started = append(started, u)
		go func() {
			defer close(u.done)
			if s.Run == nil {
				<-uctx.Done()
				return
			}
			report(s.Name, s.Run(uctx))
		}()
	}

	select {
	case <-ctx.Done():
	case <-failed.Done():
	}
	for i := len(started) - 1; i >= 0; i-- {
		u := started[i]
		if u.svc.Stop != nil {
			u.svc.Stop(failed)
		}
		u.cancel()
		awaitStopped(u, failed)
	}
	for _, u := range started {
		<-u.done
	}
	if failed.Err() != nil {
		return context.Cause(failed)
	}
	return nil
}

// awaitStopped waits for u's Run to return, at most its StopTimeout, and not
// at all once a service failed: everything was cancelled at once then.
func awaitStopped(u *unit, failed context.Context) {
	var timeout <-chan time.Time
	if d := u.svc.StopTimeout; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-u.done:
	case <-timeout:
	case <-failed.Done():
	}
}
