package frontend

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
)

// The closed degraded quota policy (docs/policy.md) refuses a tenant with
// a quota as quota_exceeded and a class with limits as overloaded: the
// client sees 429 and 503.
func TestClosedDegradedRefusalsAre429ForATenantAnd503ForAClass(t *testing.T) {
	tenant := admissionError(&scheduler.RejectError{Reason: scheduler.ReasonQuotaExceeded, Limit: scheduler.LimitTenantConcurrent,
		Detail: "tenant acme has a quota and this replica admits in a degraded mode with the closed quota policy"}, 1)
	require.Equal(t, http.StatusTooManyRequests, tenant.Status)
	require.Equal(t, "quota_exceeded", tenant.Code)

	class := admissionError(&scheduler.RejectError{Reason: scheduler.ReasonOverloaded, Limit: scheduler.LimitRequests,
		Detail: "class gold has queue limits and this replica admits in a degraded mode with the closed quota policy"}, 1)
	require.Equal(t, http.StatusServiceUnavailable, class.Status)
	require.Equal(t, "overloaded", class.Code)
	require.Contains(t, class.Message, "closed quota policy")
}
