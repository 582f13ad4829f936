package engine

import "errors"

var (
	// ErrInvalidRequest is wrapped when a request is malformed (empty id or
	// prompt, non-positive MaxTokens).
	ErrInvalidRequest = errors.New("engine: invalid request")
	// ErrTooLong is wrapped when prompt plus MaxTokens exceeds MaxModelLen or
	// could never fit in the KV pool.
	ErrTooLong = errors.New("engine: request too long")
	// ErrDuplicateID is returned when a request id is already in the engine.
	ErrDuplicateID = errors.New("engine: duplicate request id")
	// ErrQueueFull is returned when MaxWaiting requests already wait.
	ErrQueueFull = errors.New("engine: waiting queue full")
	// ErrStopped is returned by Submit after Stop.
	ErrStopped = errors.New("engine: stopped")
	// ErrBusy is returned by ResetPrefixCache while requests hold blocks.
	ErrBusy = errors.New("engine: busy")
)
