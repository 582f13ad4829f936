// Package tlsconf builds crypto/tls configurations for every link of
// Switchyard from files: the router's and workers' HTTP listeners, the
// router's connections to engines, etcd and NATS clients.
//
// # What it owns
//
//   - ServerConfig and ClientConfig: the file paths and options of one
//     side of a link, their flags and Validate, and Build, which loads the
//     files once (a bad file fails at start, naming the field).
//   - Reloading: a built configuration re-reads its certificate, key and
//     client CA bundle when their contents change, checked at most once per
//     CheckInterval (default 1 s) during a handshake. Polling, not inotify:
//     it works the same for a file rewritten in place, renamed over, or
//     swapped through the symlinks of a Kubernetes secret volume. A change
//     that does not parse (a key written before its certificate) keeps the
//     previous material and is counted and logged; the next check retries.
//     A client's CA bundle (RootCAs) is read once, at Build: rotating the CA
//     a client trusts means a bundle with both CAs and a restart.
//   - CA: a throwaway certificate authority (crypto/x509, ECDSA P-256) that
//     issues server and client certificates, for `switchyard up --tls` and
//     tests.
//
// # Defaults
//
// TLS 1.2 is the lowest version accepted (MinVersion "1.3" raises it); Go's
// default cipher suites and curves apply.
//
// # Concurrency
//
// Nothing here starts a goroutine. A built *tls.Config may be used by any
// number of connections at once: the reload check holds a mutex while it
// re-reads the files, so concurrent handshakes share one read.
package tlsconf
