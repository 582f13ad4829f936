package bench

import "syscall"

// rusageThread asks getrusage for the calling thread's CPU time alone.
const rusageThread = syscall.RUSAGE_THREAD
