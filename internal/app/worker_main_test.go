package app

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every test of package app leaves no goroutine behind.
// (One TestMain per package: other app test files must not declare their own.)
func TestMain(m *testing.M) {
	runEngineChildIfAsked() // hung_engine_test.go's SIGSTOPped engine
	goleak.VerifyTestMain(m,
		// Embedded etcd and the etcd client leave these behind until the
		// process ends; they belong to the third-party libraries, not to us.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		// memberlist's Shutdown does not wait for a probe in flight; the probe
		// goroutine returns on its own once its ack timeout passes.
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
	)
}
