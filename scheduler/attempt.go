package scheduler

// AttemptState is what a Core knows of one attempt of a request: the
// owner's side of an entry's status probe (admission/status.go).
type AttemptState int

// The states of an attempt. They start at one so that the zero value is
// no state at all.
const (
	// AttemptUnknown: never seen, or already finished (rejected,
	// cancelled, or granted and acknowledged, freed or expired).
	AttemptUnknown AttemptState = iota + 1
	// AttemptQueued: the attempt waits in its class's queue.
	AttemptQueued
	// AttemptGranted: the attempt holds a grant not yet acknowledged.
	AttemptGranted
)

func (s AttemptState) String() string {
	switch s {
	case AttemptUnknown:
		return "unknown"
	case AttemptQueued:
		return "queued"
	case AttemptGranted:
		return "granted"
	}
	return "invalid"
}

// Attempt reports what the Core knows of attempt of requestID and, when it
// holds an unacknowledged grant, that grant's booking. A grant already
// acknowledged reads unknown: the entry took it, so nobody asks again.
func (c *Core) Attempt(requestID string, attempt int) (AttemptState, BookingID) {
	if e := c.entries[requestID]; e != nil && e.req.Attempt == attempt {
		return AttemptQueued, 0
	}
	if b := c.unacked[grantKey{requestID, attempt}]; b != nil {
		return AttemptGranted, b.id
	}
	return AttemptUnknown, 0
}
