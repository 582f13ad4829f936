// Package links holds the security settings of a process's links to etcd
// and NATS (TLS, mutual TLS, and each server's credentials) and turns them
// into the clients' own options: clientv3.Config for etcd, nats.Option for
// NATS. Routers, workers and adapters register the same flags (-etcd.*,
// -nats.*), so every process is configured alike (docs/security.md).
//
// Secrets are read from files where the client allows it (a password file,
// a token file, an NKey seed, a creds file) so they stay out of process
// listings; a flag or its SWITCHYARD_* environment variable also works.
// Nothing is logged but the names of the files.
//
// Concurrency: nothing here starts a goroutine; the TLS configurations it
// builds re-read client certificates on change (package tlsconf).
package links
