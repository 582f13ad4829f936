package kvindex

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

const hugePage = 2 << 20

// adviseHugePages asks the kernel to back the whole 2 MiB pages inside
// slots with transparent huge pages. A lookup reads hundreds of random lines
// of a table far larger than the TLB covers with 4 KiB pages, and in a
// virtual machine every TLB miss is a two-level page walk; with 2 MiB pages
// the tables' translations fit in the TLB (the fleet benchmark's lookups:
// see the shard-count comment in index.go). It is called on a new table
// before it is written: memory the Go heap takes fresh from the kernel then
// faults in as huge pages; memory it reuses was faulted already and is only
// marked, for khugepaged to collapse later. With THP set to "madvise" (the
// common default) nothing else would make the tables huge, with "always" it
// changes nothing, with "never" the kernel ignores it. Errors are ignored:
// huge pages are an optimisation.
func adviseHugePages(slots []slot) {
	if len(slots) == 0 {
		return
	}
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&slots[0])), uintptr(len(slots))*unsafe.Sizeof(slot{}))
	start := uintptr(unsafe.Pointer(&mem[0]))
	lo := (start + hugePage - 1) &^ (hugePage - 1)
	hi := (start + uintptr(len(mem))) &^ (hugePage - 1)
	if hi <= lo {
		return
	}
	_ = unix.Madvise(mem[lo-start:hi-start], unix.MADV_HUGEPAGE)
}
