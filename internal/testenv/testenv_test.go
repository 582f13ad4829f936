package testenv

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	RunNATSChildIfAsked()
	goleak.VerifyTestMain(m,
		// etcd's embedded server and its gRPC stack leave background loggers and
		// pollers that stop asynchronously after Close returns.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

func TestEmbeddedEtcdServesPutAndGet(t *testing.T) {
	e := StartEtcd(t)
	c := e.Client(t)
	ctx := Context(t)
	_, err := c.Put(ctx, "/k", "v")
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	resp, err := c.Get(ctx, "/k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get = %v, %v; want one kv with value v", resp, err)
	}
}

func TestEmbeddedNATSDeliversRequestReply(t *testing.T) {
	n := StartNATS(t)
	nc := n.Conn(t)
	sub, err := nc.Subscribe("ping", func(m *nats.Msg) { _ = m.Respond([]byte("pong")) })
	_ = sub
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	msg, err := nc.Request("ping", nil, 2*time.Second)
	if err != nil || string(msg.Data) != "pong" {
		t.Fatalf("request = %v, %v; want pong", msg, err)
	}
}
