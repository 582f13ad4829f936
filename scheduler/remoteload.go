package scheduler

import (
	"maps"
	"sync/atomic"
)

// RemoteLoads is a VersionedLoadView that its owner feeds with complete
// snapshots of the other replicas' load (one per gossip round). Store bumps
// the version only when some worker's load changed, so between changes the
// Core keeps its cached remote loads and its blocked-class memo, and a
// selection over many workers makes no interface calls. Safe for concurrent
// use: Store from one goroutine, reads from the actor.
type RemoteLoads struct {
	cur atomic.Pointer[remoteLoadsSnap]
}

type remoteLoadsSnap struct {
	version uint64
	loads   map[string]WorkerLoad // zero loads are left out
}

// Store installs loads (copied; workers missing from it carry no remote
// load) and reports whether anything changed.
func (v *RemoteLoads) Store(loads map[string]WorkerLoad) bool {
	next := make(map[string]WorkerLoad, len(loads))
	for w, l := range loads {
		if l != (WorkerLoad{}) {
			next[w] = l
		}
	}
	old := v.cur.Load()
	var ver uint64
	if old != nil {
		if maps.Equal(old.loads, next) {
			return false
		}
		ver = old.version
	}
	v.cur.Store(&remoteLoadsSnap{version: ver + 1, loads: next})
	return true
}

// RemoteLoad is worker's load booked by other replicas, as last stored.
func (v *RemoteLoads) RemoteLoad(worker string) WorkerLoad {
	if s := v.cur.Load(); s != nil {
		return s.loads[worker]
	}
	return WorkerLoad{}
}

// LoadVersion changes with every Store that changed a load.
func (v *RemoteLoads) LoadVersion() uint64 {
	if s := v.cur.Load(); s != nil {
		return s.version
	}
	return 0
}
