package scheduler

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// Drains are bound by reading the queued entries' headers: one header,
// one cache line. The cold part is reached only through its pointer.
func TestTheQueuedEntryHeaderFitsOneCacheLine(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(entry{}), uintptr(64), "entry is %d bytes", unsafe.Sizeof(entry{}))
}
