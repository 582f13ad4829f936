package testenv

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// AwaitPermissionViolation waits up to 5 s for the NATS server's permission
// violation naming subject on errs (a connection's async error handler
// feeds it); other violations, such as a refused request's inbox, are
// skipped. Any other error fails the test.
func AwaitPermissionViolation(t testing.TB, errs <-chan error, subject string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-errs:
			require.True(t, errors.Is(err, nats.ErrPermissionViolation), "%v", err)
			if strings.Contains(err.Error(), `"`+subject+`"`) {
				return
			}
		case <-timeout:
			t.Fatalf("no permission violation for %s", subject)
		}
	}
}
