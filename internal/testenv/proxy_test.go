package testenv

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startEcho runs a line echo server until the test ends.
func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return line, err
}

func TestProxyForwardsUntilCutAndAgainAfterRestore(t *testing.T) {
	p := StartProxy(t, startEcho(t))

	c1, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c1.Close()
	got, err := roundTrip(c1, "hello")
	require.NoError(t, err)
	require.Equal(t, "hello\n", got)

	p.Cut()
	_, err = roundTrip(c1, "after cut")
	require.Error(t, err, "an established connection must die when the proxy is cut")

	c2, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err, "the listener stays open; new connections are closed at once")
	defer c2.Close()
	_, err = roundTrip(c2, "while cut")
	require.Error(t, err, "a connection opened while cut must not reach the target")

	p.Restore()
	c3, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c3.Close()
	got, err = roundTrip(c3, "restored")
	require.NoError(t, err)
	require.Equal(t, "restored\n", got)
}
