// Package app wires Switchyard's components into processes: a router replica,
// a simulated worker, and the local cluster of `switchyard up`. Only
// cmd/switchyard and e2e/ import it.
//
// Each process has one owner goroutine: the Run/Main functions here start
// every component's Run(ctx) under one errgroup-like supervisor and return
// only after all of them have exited.
package app
