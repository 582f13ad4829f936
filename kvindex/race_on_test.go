//go:build race

package kvindex

// raceBuild is true under the race detector, which drops a quarter of
// sync.Pool's puts on purpose, so allocation counts of pooled paths are
// only asserted without it.
const raceBuild = true
