// Package testenv starts real infrastructure in-process for tests: an embedded
// etcd server (go.etcd.io/etcd/server/v3/embed) and a NATS server
// (nats-server/v2/server), each on loopback with ephemeral ports. A NATS
// server can also run in a child process (StartNATSProcess: the test binary
// re-executed, its TestMain calling RunNATSChildIfAsked first), for
// benchmarks that count only their own process's CPU time.
//
// Every helper registers its own cleanup with t.Cleanup, so a test never has to
// stop what it started. Nothing here is linked into cmd/switchyard: production
// code that needs embedded servers (switchyard up) lives in internal/app.
package testenv
