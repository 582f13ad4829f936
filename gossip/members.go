package gossip

import (
	"net"
	"slices"
	"strconv"
	"sync"

	"github.com/hashicorp/memberlist"
)

// memberTable is this replica's copy of the live members, kept by
// memberlist's event callbacks. Memberlist.Members returns pointers to its
// own node records, whose address and meta its packet handler rewrites
// without a lock the caller could take, so reading them races; the event
// callbacks run under memberlist's node lock, so copying there is safe.
type memberTable struct {
	mu    sync.Mutex
	nodes map[string]memberCopy
}

type memberCopy struct {
	addr string
	meta []byte
	// node is the address part of memberlist's record, for SendReliable.
	node memberlist.Node
}

func newMemberTable() *memberTable { return &memberTable{nodes: make(map[string]memberCopy)} }

func (t *memberTable) set(n *memberlist.Node) {
	c := memberCopy{addr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port))), meta: slices.Clone(n.Meta),
		node: memberlist.Node{Name: n.Name, Addr: slices.Clone(n.Addr), Port: n.Port}}
	t.mu.Lock()
	t.nodes[n.Name] = c
	t.mu.Unlock()
}

// node returns a copy of name's address record, false when name is not a
// live member.
func (t *memberTable) node(name string) (*memberlist.Node, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.nodes[name]
	if !ok {
		return nil, false
	}
	n := c.node
	return &n, true
}

// reset forgets every member (a new memberlist starts from itself).
func (t *memberTable) reset() {
	t.mu.Lock()
	clear(t.nodes)
	t.mu.Unlock()
}

// NotifyJoin, NotifyLeave and NotifyUpdate implement memberlist.EventDelegate.
func (t *memberTable) NotifyJoin(n *memberlist.Node)   { t.set(n) }
func (t *memberTable) NotifyUpdate(n *memberlist.Node) { t.set(n) }
func (t *memberTable) NotifyLeave(n *memberlist.Node) {
	t.mu.Lock()
	delete(t.nodes, n.Name)
	t.mu.Unlock()
}

// snapshot returns the members sorted by name.
func (t *memberTable) snapshot() (names []string, copies []memberCopy) {
	t.mu.Lock()
	defer t.mu.Unlock()
	names = make([]string, 0, len(t.nodes))
	for name := range t.nodes {
		names = append(names, name)
	}
	slices.Sort(names)
	copies = make([]memberCopy, len(names))
	for i, name := range names {
		copies[i] = t.nodes[name]
	}
	return names, copies
}
