// Package app wires Switchyard's components into processes: a router replica,
// a simulated worker, and the local cluster of `switchyard up`. Only
// cmd/switchyard and e2e/ import it.
//
// Each process has one owner goroutine: the Run/Main functions here start
// every component's Run(ctx) and return only after all of them have exited.
// A router replica is a set of services (internal/service) with declared
// dependencies, started in dependency order and stopped in reverse: the
// reverse order is its lame-duck shutdown (RunReplica, replica.services,
// lame_duck.go). The local cluster runs its replicas and workers as peers
// under an errgroup.
package app
