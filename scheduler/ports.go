package scheduler

// LoadView reports the load other replicas have booked on a worker (their
// gossiped ledgers). The selector adds it to the local ledger. It is called
// on the admission hot path, once per candidate worker: it must be cheap,
// non-blocking and safe for use from the actor goroutine.
type LoadView interface {
	RemoteLoad(worker string) WorkerLoad
}

// VersionedLoadView is a LoadView whose content changes in discrete updates
// (gossip rounds). When the LoadView also implements it, the Core caches every
// worker's remote load and calls RemoteLoad again only after LoadVersion
// changes, so a selection over 1000 workers costs no interface calls.
type VersionedLoadView interface {
	LoadView
	// LoadVersion changes (e.g. increments) whenever any RemoteLoad answer may
	// have changed.
	LoadVersion() uint64
}
