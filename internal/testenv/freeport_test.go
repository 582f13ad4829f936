package testenv

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// FreePort's ports lie below the ephemeral range, where no outgoing
// connection or ":0" listener of a parallel test can take them, and can be
// bound.
func TestFreePortIsBelowTheEphemeralRangeAndBindable(t *testing.T) {
	low := ephemeralLow()
	for range 20 {
		port := FreePort(t)
		require.Less(t, port, low)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		require.NoError(t, err)
		require.NoError(t, l.Close())
	}
}
