// Command nats-server is the NATS server for Switchyard's container images:
// github.com/nats-io/nats-server/v2 at the version pinned in go.mod (the same
// server the in-process tests start), with upstream's flags and config file,
// plus `nats-server healthcheck [-url URL]` for the image's HEALTHCHECK (an
// image built FROM scratch has no curl). The probe needs the monitoring port
// (-m 8222), whose /healthz answers 200 once the server accepts clients.
//
// auth.conf is the users and subject permissions of a cluster (one user per
// role: routers, and each worker or adapter), nats-tls.conf adds TLS with
// client certificates to it; docs/security.md explains both. The tests load
// the shipped files into an in-process server.
//
// Concurrency: the server owns its goroutines; healthcheck is one blocking
// HTTP request bounded by -timeout.
package main
