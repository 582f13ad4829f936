package app

import (
	"context"
	"errors"
	"sync"
)

// group runs long-running components: the first one to fail cancels the
// others, and wait returns only after every one of them has returned.
type group struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	err    error
}

func newGroup(ctx context.Context) *group {
	ctx, cancel := context.WithCancel(ctx)
	return &group{ctx: ctx, cancel: cancel}
}

// go runs fn(ctx) under the group; name prefixes its error.
func (g *group) go_(name string, fn func(ctx context.Context) error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		err := fn(g.ctx)
		if err != nil && !errors.Is(err, context.Canceled) {
			g.mu.Lock()
			if g.err == nil {
				g.err = errors.New(name + ": " + err.Error())
			}
			g.mu.Unlock()
			g.cancel()
		}
	}()
}

// wait waits for every component and returns the first failure.
func (g *group) wait() error {
	g.wg.Wait()
	g.cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}
