// Package wire holds the message types and codecs shared by routers and
// workers, and the one place where NATS subjects and etcd keys are spelled.
//
// Every payload carries a version. Every decoder validates its input, returns a
// typed error wrapping ErrMalformed or ErrVersion on bad input, and never
// panics; each decoder has a fuzz test. Encoders and decoders are pure
// functions and safe for concurrent use.
package wire
