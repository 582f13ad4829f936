package kvindex

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestLargeTablesAreAdvisedToUseHugePages grows a shard's table past a few
// huge pages and checks, in /proc/self/smaps, that the kernel marked the
// mapping holding it for transparent huge pages ("hg" in VmFlags). Whether
// the kernel then backs it with huge pages depends on its THP setting and
// free memory, so that is not asserted.
func TestLargeTablesAreAdvisedToUseHugePages(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil {
		t.Skipf("skipped: this kernel has no transparent huge pages (%v)", err)
	}
	var s shard
	s.init(newSetStore(1))
	s.mu.Lock()
	for _, h := range chain(8, 600_000) { // grows to about 12 MiB of slots
		s.addLocked(h, 1)
	}
	s.mu.Unlock()
	slots := s.tab.Load().slots
	require.Greater(t, len(slots)*16, 3*hugePage)
	mid := uintptr(unsafe.Pointer(&slots[len(slots)/2]))
	flags, err := vmFlagsAt(mid)
	require.NoError(t, err)
	require.Contains(t, strings.Fields(flags), "hg", "VmFlags of the mapping holding the table: %s", flags)
}

// vmFlagsAt returns the VmFlags line of the mapping containing addr.
func vmFlagsAt(addr uintptr) (string, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	inside := false
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := mappingRange(line); ok {
			inside = lo <= addr && addr < hi
			continue
		}
		if inside && strings.HasPrefix(line, "VmFlags:") {
			return strings.TrimPrefix(line, "VmFlags:"), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no mapping holds %#x", addr)
}

// mappingRange parses a smaps header line ("7f00-7f80 rw-p ...").
func mappingRange(line string) (lo, hi uintptr, ok bool) {
	r, _, found := strings.Cut(line, " ")
	if !found {
		return 0, 0, false
	}
	a, b, found := strings.Cut(r, "-")
	if !found {
		return 0, 0, false
	}
	x, err1 := strconv.ParseUint(a, 16, 64)
	y, err2 := strconv.ParseUint(b, 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uintptr(x), uintptr(y), true
}
