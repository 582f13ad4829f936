package app

import (
	"context"
	"errors"
	"fmt"
)

// named adapts a long-running component to errgroup.Group.Go: fn runs with
// ctx, a failure is returned as "name: err" with err's chain kept (so
// errors.Is and errors.As see through it), and a cancellation is not a
// failure, so it does not stop the other components of the group.
func named(ctx context.Context, name string, fn func(ctx context.Context) error) func() error {
	return func() error {
		err := fn(ctx)
		if err == nil || errors.Is(err, context.Canceled) {
			return nil
		}
		return fmt.Errorf("%s: %w", name, err)
	}
}
