package cluster

import "errors"

var (
	// ErrInvalidConfig is wrapped by every Validate error.
	ErrInvalidConfig = errors.New("cluster: invalid config")
	// ErrSessionExpired means the session's lease is gone (expired on the
	// server, or the client was closed): everything bound to it is lost and a
	// new Session is needed.
	ErrSessionExpired = errors.New("cluster: session expired")
	// ErrNoLease is returned by operations that need the session's lease
	// before Session.Run has been granted one.
	ErrNoLease = errors.New("cluster: session has no lease yet")
	// ErrBadRecord is wrapped by decode errors of etcd records this package
	// owns (class owner values, config); registry records use wire's errors.
	ErrBadRecord = errors.New("cluster: bad record")
)
