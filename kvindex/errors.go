package kvindex

import "errors"

var (
	// ErrTooManyWorkers is returned when registering a worker would exceed
	// Config.MaxWorkers (worker ids are interned to 16 bits).
	ErrTooManyWorkers = errors.New("kvindex: too many workers")
	// ErrUnknownWorker is returned for operations on a worker the index does
	// not know.
	ErrUnknownWorker = errors.New("kvindex: unknown worker")
)
