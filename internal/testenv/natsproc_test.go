package testenv

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

func TestNATSInAChildProcessCountsWhatItReceivesAndDelivers(t *testing.T) {
	p := StartNATSProcess(t)
	pub, subc := p.Conn(t), p.Conn(t)
	got := make(chan string, 1)
	_, err := subc.Subscribe("greeting", func(m *nats.Msg) { got <- string(m.Data) })
	require.NoError(t, err)
	require.NoError(t, subc.Flush())
	before := p.Stats(t)

	require.NoError(t, pub.Publish("greeting", []byte("hello")))
	require.NoError(t, pub.Publish("nobody.listens", []byte("abc")))
	require.NoError(t, pub.Flush())

	select {
	case s := <-got:
		require.Equal(t, "hello", s)
	case <-time.After(10 * time.Second):
		t.Fatal("the subscriber never got the message")
	}
	after := p.Stats(t)
	require.Equal(t, int64(2), after.InMsgs-before.InMsgs, "both messages counted, delivered or not")
	require.Equal(t, int64(len("hello")+len("abc")), after.InBytes-before.InBytes)
	if ProcessCPU() > 0 { // the platform reports CPU time
		require.Positive(t, after.CPU, "the child reports its own CPU time")
	}
}
