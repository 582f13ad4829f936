// Package service runs the long-running parts of a process as services with
// declared dependencies and one lifecycle each: the pattern of grafana/dskit's
// services and modules packages, reduced to what a Switchyard process needs.
//
// A Service is starting (Start returns once the service is ready for the
// services that depend on it), running (Run, until its context ends) and
// stopping (Stop, a graceful phase while Run still runs: drain, hand off,
// export). A Manager starts the services in dependency order, keeping the
// declared order where the dependencies allow it, and stops them in exactly
// the reverse order: a service stops only after every service that depends
// on it has stopped, so it never loses something it uses while it winds
// down. A dependency cycle, an unknown dependency or a duplicate name is an
// error of New, before anything runs.
//
// The first Start or Run that fails (an error other than context.Canceled)
// stops everything at once: every service's context is cancelled together,
// since a failed dependency may never let its dependents finish in order;
// the Stop hooks still run in reverse order, with a context that is already
// done so they skip their waits; and Manager.Run returns the failure as
// "name: err", its chain kept for errors.Is and errors.As.
//
// # Concurrency
//
// Manager.Run owns every goroutine it starts (one per running service) and
// returns only after every Run has returned. Start and Stop are called one at
// a time from the goroutine of Manager.Run.
package service
