package scheduler

import "errors"

// Sentinels. Rejections are *RejectError values that unwrap to one of these
// according to their Reason; ErrCancelled is returned as is
// (wrapped with context).
var (
	ErrDeadlineExceeded  = errors.New("scheduler: deadline exceeded")
	ErrPredictedMiss     = errors.New("scheduler: predicted deadline miss")
	ErrQueueFull         = errors.New("scheduler: queue full")
	ErrNoEndpoints       = errors.New("scheduler: no endpoints")
	ErrOverloaded        = errors.New("scheduler: overloaded")
	ErrOwnershipMoved    = errors.New("scheduler: class ownership moved")
	ErrInvalidConstraint = errors.New("scheduler: invalid worker constraint")
	ErrUnknownClass      = errors.New("scheduler: unknown class")
	ErrQuotaExceeded     = errors.New("scheduler: tenant quota exceeded")
	// ErrCancelled: the requester withdrew while queued (Admit's ctx ended).
	ErrCancelled = errors.New("scheduler: cancelled")
	// ErrInvalidConfig: a Config, ClassConfig or Worker failed validation.
	ErrInvalidConfig = errors.New("scheduler: invalid config")

	errUnknownReason = errors.New("scheduler: unknown rejection reason")
)
