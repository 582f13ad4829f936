//go:build !linux

package bench

import "syscall"

// rusageThread falls back to the process's CPU time where getrusage has no
// per-thread form; the measurement then counts other goroutines too.
const rusageThread = syscall.RUSAGE_SELF
