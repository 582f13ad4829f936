package wire

import "errors"

var (
	// ErrMalformed is wrapped by every decoding error caused by bad bytes.
	ErrMalformed = errors.New("wire: malformed message")
	// ErrVersion is wrapped when a message carries a version this build does
	// not understand.
	ErrVersion = errors.New("wire: unsupported version")
)
