//go:build !linux

package kvindex

// adviseHugePages is a no-op where transparent huge pages do not exist.
func adviseHugePages([]slot) {}
