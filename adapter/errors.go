package adapter

import "errors"

// Sentinel errors of the package; every error it returns wraps one.
var (
	// ErrInvalidConfig: a configuration field is out of range.
	ErrInvalidConfig = errors.New("adapter: invalid config")
	// ErrDiscovery: the engine's answer to a discovery request could not
	// be used (unreachable, bad status, malformed body, absurd values).
	ErrDiscovery = errors.New("adapter: engine discovery failed")
	// ErrMalformed: an engine answer does not parse or holds absurd values.
	ErrMalformed = errors.New("adapter: malformed engine answer")
)
