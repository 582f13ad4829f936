package kvingest

import "errors"

var (
	// ErrDumpFailed wraps every reason a dump could not be fetched: no
	// responder, timeout, malformed or out-of-order chunks.
	ErrDumpFailed = errors.New("kvingest: dump failed")
	// ErrNoResponders is wrapped when no process answers a worker's dump
	// subject.
	ErrNoResponders = errors.New("kvingest: no responders for dump")
)
