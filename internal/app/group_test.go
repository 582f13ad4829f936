package app

import (
	"context"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
)

func TestAFailedComponentStopsTheGroupAndItsErrorKeepsTheChainAndTheName(t *testing.T) {
	grp, ctx := errgroup.WithContext(context.Background())
	grp.Go(named(ctx, "disk", func(context.Context) error { return &fs.PathError{Op: "open", Path: "/x", Err: fs.ErrNotExist} }))
	grp.Go(named(ctx, "peer", func(ctx context.Context) error {
		<-ctx.Done() // stopped by the other's failure
		return ctx.Err()
	}))
	err := grp.Wait()
	require.ErrorIs(t, err, fs.ErrNotExist)
	var pe *fs.PathError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "disk: open /x: file does not exist", err.Error())
}

func TestACancelledComponentIsNotAFailureAndStopsNoOther(t *testing.T) {
	grp, ctx := errgroup.WithContext(context.Background())
	quit := make(chan struct{})
	grp.Go(named(ctx, "quitter", func(context.Context) error {
		defer close(quit)
		return context.Canceled
	}))
	grp.Go(named(ctx, "other", func(ctx context.Context) error {
		<-quit
		require.NoError(t, ctx.Err(), "the others keep running")
		return nil
	}))
	require.NoError(t, grp.Wait())
}
