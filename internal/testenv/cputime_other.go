//go:build !unix

package testenv

import "time"

// ProcessCPU is unavailable here; benchmarks then report no CPU figures.
func ProcessCPU() time.Duration { return 0 }
