package wire

import (
	"encoding/json"
	"fmt"
)

// RegistryVersion is the version of WorkerInfo and ReplicaInfo records.
const RegistryVersion = 1

// WorkerInfo is a worker's registration, stored as JSON under Keys.Worker(id)
// with the worker's lease. Routers watch the prefix and select among the
// registered workers.
type WorkerInfo struct {
	Version   int    `json:"version"`
	ID        string `json:"id"`
	URL       string `json:"url"` // base URL, e.g. http://127.0.0.1:9001 (no /v1)
	Model     string `json:"model"`
	BlockSize int    `json:"block_size"` // tokens per KV block
	KVBlocks  int    `json:"kv_blocks"`  // total KV blocks of the engine
	// MaxNumSeqs and MaxBatchedTokens are the engine's batch limits.
	MaxNumSeqs       int               `json:"max_num_seqs"`
	MaxBatchedTokens int               `json:"max_batched_tokens"`
	Labels           map[string]string `json:"labels,omitempty"`
	// PublishesEvents is false for engines that publish no KV events; routers
	// then keep longer-lived predicted entries for it.
	PublishesEvents bool `json:"publishes_events"`
}

// Validate reports what is wrong with a registration.
func (w *WorkerInfo) Validate() error {
	switch {
	case w.Version != RegistryVersion:
		return fmt.Errorf("%w: worker info version %d", ErrVersion, w.Version)
	case !ValidName(w.ID):
		return fmt.Errorf("%w: worker id %q", ErrMalformed, w.ID)
	case w.URL == "":
		return fmt.Errorf("%w: worker %s has no url", ErrMalformed, w.ID)
	case w.BlockSize <= 0:
		return fmt.Errorf("%w: worker %s block_size %d", ErrMalformed, w.ID, w.BlockSize)
	case w.KVBlocks <= 0:
		return fmt.Errorf("%w: worker %s kv_blocks %d", ErrMalformed, w.ID, w.KVBlocks)
	case w.MaxNumSeqs < 0 || w.MaxBatchedTokens < 0:
		return fmt.Errorf("%w: worker %s has negative batch limits", ErrMalformed, w.ID)
	}
	return nil
}

// EncodeWorkerInfo returns the JSON form of w.
func EncodeWorkerInfo(w *WorkerInfo) ([]byte, error) {
	w.Version = RegistryVersion
	return json.Marshal(w)
}

// DecodeWorkerInfo parses and validates a registration.
func DecodeWorkerInfo(b []byte) (*WorkerInfo, error) {
	var w WorkerInfo
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("%w: worker info: %v", ErrMalformed, err)
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	if len(w.Labels) == 0 {
		w.Labels = nil // `{}` and absent mean the same; keep one form
	}
	return &w, nil
}

// ReplicaInfo is a router replica's registration under Keys.Replica(id).
type ReplicaInfo struct {
	Version    int    `json:"version"`
	ID         string `json:"id"`
	HTTPAddr   string `json:"http_addr"`   // host:port of the OpenAI API
	GossipAddr string `json:"gossip_addr"` // host:port of memberlist
	Build      string `json:"build"`
	// Ready is set once the replica has its registries and index and can own
	// classes; placement only considers ready replicas.
	Ready bool `json:"ready"`
}

// Validate reports what is wrong with a registration.
func (r *ReplicaInfo) Validate() error {
	switch {
	case r.Version != RegistryVersion:
		return fmt.Errorf("%w: replica info version %d", ErrVersion, r.Version)
	case !ValidName(r.ID):
		return fmt.Errorf("%w: replica id %q", ErrMalformed, r.ID)
	}
	return nil
}

// EncodeReplicaInfo returns the JSON form of r.
func EncodeReplicaInfo(r *ReplicaInfo) ([]byte, error) {
	r.Version = RegistryVersion
	return json.Marshal(r)
}

// DecodeReplicaInfo parses and validates a replica registration.
func DecodeReplicaInfo(b []byte) (*ReplicaInfo, error) {
	var r ReplicaInfo
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w: replica info: %v", ErrMalformed, err)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}
