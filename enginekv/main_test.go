package enginekv

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// zmq4 v0.17.0's PUB socket starts a writer goroutine (pubMWriter.run)
	// that its Close never stops: pubSocket.Close cancels the socket but
	// never calls the writer's Close, so the goroutine waits on its
	// condition variable for the life of the process, one per PUB socket
	// ever made. It is not ours to stop; everything else must exit.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
