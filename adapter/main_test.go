package adapter

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/internal/testenv"
)

func TestMain(m *testing.M) {
	// BenchmarkAdapterThroughput's nats=proc runs its NATS server in
	// this binary re-executed; in that child only the server runs.
	testenv.RunNATSChildIfAsked()
	goleak.VerifyTestMain(m,
		// Embedded etcd and the etcd client leave these behind until the
		// process ends; they belong to the third-party libraries.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}
