package kvingest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/kvtest"
	"github.com/switchyard/switchyard/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.RunNATSChildIfAsked()
	goleak.VerifyTestMain(m)
}

func TestConfigValidationNamesTheBadField(t *testing.T) {
	s := DefaultConfig()
	require.NoError(t, s.Validate())
	s.DumpRetryMax = s.DumpRetry / 2
	require.ErrorContains(t, s.Validate(), "DumpRetryMax")
}

// newFakeClock is the tests' manually advanced clock.
func newFakeClock() *clock.Fake { return clock.NewFake(time.Unix(1_700_000_000, 0)) }

// The event builders the index's and its ingest's tests share.
var (
	chain        = kvtest.Chain
	stored       = kvtest.Stored
	removed      = kvtest.Removed
	batch        = kvtest.Batch
	sortedHashes = kvtest.SortedHashes
	ptr          = kvtest.Ptr
)
