//go:build unix

package scheduler

import (
	"syscall"
	"time"
)

// processCPU is the process's user+system CPU time. Benchmarks report CPU
// time per operation next to wall time because the shared benchmark machine
// deschedules us: wall ns/op there includes time other processes ran.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
