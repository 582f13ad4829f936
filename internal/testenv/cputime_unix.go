//go:build unix

package testenv

import (
	"syscall"
	"time"
)

// ProcessCPU is the process's user+system CPU time. Benchmarks report work
// per CPU-second beside work per wall second because the shared benchmark
// machine deschedules them: wall time there includes time other processes
// ran. It counts every goroutine of the process, in-process servers (NATS,
// etcd) included, so per-CPU figures are conservative.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
