package app

import (
	"net"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

// `up` on port 0 picks etcd's ports before etcd binds them, so on a busy
// machine another socket can take one in between (CI saw exactly that).
// Here the first pick is a port the test holds: the start is tried again
// on fresh ports and etcd serves on the second pair.
func TestEmbeddedEtcdOnFreePortsRetriesAPortTakenBeforeItBound(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	heldPort := held.Addr().(*net.TCPAddr).Port

	var picked []int
	pick := func(string) (int, error) {
		p := testenv.FreePort(t)
		if len(picked) == 0 {
			p = heldPort
		}
		picked = append(picked, p)
		return p, nil
	}
	u, stop, err := startEmbeddedEtcdOnFreePorts(filepath.Join(t.TempDir(), "etcd"), "127.0.0.1", nil, pick)
	require.NoError(t, err)
	defer stop()
	require.Len(t, picked, 4, "one pair refused, one pair started")
	require.Equal(t, "http://127.0.0.1:"+strconv.Itoa(picked[2]), u, "etcd serves on the second pair's client port")
}

// When every pair it is given is taken, the start fails with the bind
// error, naming the port, after a bounded number of tries.
func TestEmbeddedEtcdOnFreePortsGivesUpWithTheBindError(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	heldPort := held.Addr().(*net.TCPAddr).Port
	tries := 0
	pick := func(string) (int, error) { tries++; return heldPort, nil }
	_, _, err = startEmbeddedEtcdOnFreePorts(filepath.Join(t.TempDir(), "etcd"), "127.0.0.1", nil, pick)
	require.ErrorIs(t, err, syscall.EADDRINUSE)
	require.Contains(t, err.Error(), "embedded etcd on 127.0.0.1:"+strconv.Itoa(heldPort))
	require.Equal(t, 2*etcdPortAttempts, tries)
}
