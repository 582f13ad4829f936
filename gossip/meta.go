package gossip

import (
	"fmt"
)

// MaxMetaBytes is memberlist's limit on node meta (memberlist.MetaMaxSize).
// Encode refuses anything larger so a replica fails at start-up, not when
// memberlist first broadcasts its alive message.
const MaxMetaBytes = 512

const metaVersion = 1

// NodeMeta is what a replica tells every other member about itself through
// memberlist's node meta. It is versioned: the first bytes are the magic "SM"
// and a format version.
type NodeMeta struct {
	// ReplicaID is the replica's identity; it equals the memberlist node name
	// and the origin of everything this replica authors.
	ReplicaID string
	// HTTPAddr is where the replica serves the OpenAI API (host:port).
	HTTPAddr string
	// Version is the build version of the replica binary.
	Version string
}

// EncodeNodeMeta encodes m. It fails with ErrMetaTooLarge when the result
// exceeds MaxMetaBytes.
func EncodeNodeMeta(m NodeMeta) ([]byte, error) {
	var b []byte
	b = append(b, 'S', 'M', metaVersion)
	b = appendString(b, m.ReplicaID)
	b = appendString(b, m.HTTPAddr)
	b = appendString(b, m.Version)
	if len(b) > MaxMetaBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrMetaTooLarge, len(b), MaxMetaBytes)
	}
	return b, nil
}

// DecodeNodeMeta parses what EncodeNodeMeta wrote. Errors wrap ErrForeign,
// ErrVersion or ErrMalformed.
func DecodeNodeMeta(p []byte) (NodeMeta, error) {
	if len(p) > MaxMetaBytes {
		return NodeMeta{}, fmt.Errorf("node meta: %w: %d bytes", ErrMalformed, len(p))
	}
	r := reader{buf: p}
	r.magic('S', 'M', metaVersion)
	var m NodeMeta
	m.ReplicaID = r.str()
	m.HTTPAddr = r.str()
	m.Version = r.str()
	r.end()
	if r.err != nil {
		return NodeMeta{}, fmt.Errorf("node meta: %w", r.err)
	}
	return m, nil
}
