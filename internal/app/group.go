package app

import (
	"context"

	"github.com/switchyard/switchyard/internal/service"
)

// named adapts a long-running component to errgroup.Group.Go: fn runs with
// ctx and its result is a service.Failure: "name: err" with err's chain
// kept, and a cancellation is not a failure, so it does not stop the other
// components of the group.
func named(ctx context.Context, name string, fn func(ctx context.Context) error) func() error {
	return func() error { return service.Failure(name, fn(ctx)) }
}
