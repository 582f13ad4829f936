package adapter

import "errors"

// Sentinel errors of the package; every error it returns wraps one.
var (
	// ErrInvalidConfig: a configuration field is out of range.
	ErrInvalidConfig = errors.New("adapter: invalid config")
	// ErrDiscovery: the engine's answer to a discovery request could not
	// be used (unreachable, bad status, malformed body, absurd values).
	ErrDiscovery = errors.New("adapter: engine discovery failed")
	// ErrEngineTLS: a request to an https:// engine failed at TLS: the
	// engine's certificate does not verify, the engine does not speak TLS,
	// or it refused the handshake (a client certificate missing or not
	// trusted). The error says which and wraps crypto/tls's or x509's.
	ErrEngineTLS = errors.New("adapter: engine TLS failed")
	// ErrMalformed: an engine answer does not parse or holds absurd values.
	ErrMalformed = errors.New("adapter: malformed engine answer")
)
