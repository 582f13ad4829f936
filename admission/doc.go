// Package admission carries admission between router replicas (design §4):
// the entry replica that received a request asks the replica that owns the
// request's policy class to admit it, over NATS when the owner is another
// replica and in-process when it is this one.
//
// Server is the owner side. While this replica owns a class (Own), it
// subscribes to admit.<class>, cancel.<class> and adopt.<class> and feeds the
// local admission actor; it always listens on life.<self> for lifecycle marks
// of the bookings it granted. Disown unsubscribes first and then rejects the
// class's queued entries with ownership_lost, so their entry replicas
// resubmit them to the next owner.
//
// Client is the entry side and implements the frontend's Admitter. It follows
// class ownership as the cluster layer reports it (OwnersChanged), retries
// with backoff while a class has no owner, resubmits requests whose owner
// moved or died (as retries, never as new arrivals), ignores grants fenced by
// a newer epoch, renews its in-flight bookings, and re-homes them (adopt) when
// their class moves. When NATS is unreachable it admits every class on the
// local actor (degraded mode, counted and exported) and returns to normal by
// itself once NATS is back.
//
// Concurrency: Server and Client are safe for concurrent use. Each has
// Run(ctx), which owns the goroutines they need (Server: none beyond NATS's
// own delivery goroutines; Client: the renew and re-home loop) and returns
// after they have exited. NATS handlers never block on the network; they may
// block briefly on the actor's input channel, which is the intended
// backpressure.
package admission
