package wire

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
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
	// Models are further names the worker serves besides Model (a base
	// model's LoRA adapters, aliases). Routers route a request to any worker
	// that serves its model name (Serves). Absent in records written before
	// it existed, which read as serving Model only.
	Models []string `json:"models,omitempty"`
	// MaxModelLen is the engine's context length in tokens (0: unknown).
	MaxModelLen int `json:"max_model_len,omitempty"`
	// Salt is the name the worker's base-model blocks are hashed under:
	// the engine's model root (vLLM's /v1/models root), so every alias of
	// the engine, and every engine of the same weights, hashes a prompt
	// alike. Empty: Model (records written before it existed). A LoRA
	// adapter's blocks are hashed under the adapter's own name.
	Salt string `json:"salt,omitempty"`
	// PrioritySchedules says the engine schedules by a request's priority
	// (vLLM run with --scheduling-policy priority): routers then pass a
	// request's priority on in vLLM's request field. Absent: it does not,
	// and a priority field would be refused by such an engine.
	PrioritySchedules bool `json:"priority_scheduling,omitempty"`
	// Cards are what the engine's /v1/models says of each served name,
	// which routers' /v1/models passes through. Absent: nothing known.
	Cards []ModelCard `json:"cards,omitempty"`
	// Tokenizer, when set, says where routers can fetch the tokenizer files
	// of the worker's models (an adapter serving the engine's model
	// directory), so a fleet needs no tokenizer configuration on routers.
	Tokenizer *TokenizerSource `json:"tokenizer,omitempty"`
	// TierBlocks is the capacity in blocks of each lower KV tier the worker
	// publishes as a stream of its own ("cpu", "disk"; see kvindex's
	// TierStream). Routers bound those streams by it.
	TierBlocks map[string]int `json:"tier_blocks,omitempty"`
	// DPSize > 1 says the worker is rank DPRank of an engine run with data
	// parallelism behind one API server at URL: routers pin the rank with
	// the X-data-parallel-rank header.
	DPRank int `json:"dp_rank,omitempty"`
	DPSize int `json:"dp_size,omitempty"`
	// APIs are the APIs the engine serves beyond OpenAI's (APIMessages);
	// routers translate a request for one it lacks. Absent in records
	// written before it existed, which read as OpenAI's only.
	APIs []string `json:"apis,omitempty"`
	// Role is what the worker does in a disaggregated fleet (RolePrefill,
	// RoleDecode, or RoleBoth; absent reads as RoleBoth): routers send a
	// long uncached prompt's prefill to a prefill worker and its decode to
	// a decode worker, and everything else to a worker of role both.
	Role string `json:"role,omitempty"`
	// KVTransfer is the protocol a prefill or decode worker's engine moves
	// KV between roles with (TransferVLLM or TransferSGLang); required with
	// a role other than both.
	KVTransfer string `json:"kv_transfer,omitempty"`
	// BootstrapPort is an SGLang prefill server's bootstrap port (its
	// --disaggregation-bootstrap-port; the host is URL's): routers pass it
	// to both legs as bootstrap_port.
	BootstrapPort int `json:"bootstrap_port,omitempty"`
}

// The worker roles of WorkerInfo.Role.
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// The KV transfer protocols of WorkerInfo.KVTransfer.
const (
	// TransferVLLM is vLLM's kv_transfer_params in two legs: prefill with
	// one output token, then decode with the parameters it returned.
	TransferVLLM = "vllm"
	// TransferSGLang is SGLang's bootstrap fields (bootstrap_host,
	// bootstrap_port, bootstrap_room) sent to both servers at once.
	TransferSGLang = "sglang"
)

// RoleOf is the worker's role, RoleBoth when the record names none.
func (w *WorkerInfo) RoleOf() string {
	if w.Role == "" {
		return RoleBoth
	}
	return w.Role
}

// APIMessages names Anthropic's Messages API (/v1/messages and
// /v1/messages/count_tokens) in WorkerInfo.APIs.
const APIMessages = "anthropic-messages"

// TokenizerSource advertises a model's tokenizer files served over HTTP.
type TokenizerSource struct {
	// Spec names a built-in tokenizer instead of files (for example
	// "tiktoken:o200k_base"); URL and SHA256 are then empty.
	Spec string `json:"spec,omitempty"`
	// URL is the base URL the files are served under: URL + "/" + name.
	URL string `json:"url,omitempty"`
	// Files are the file names served (tokenizer.json, tokenizer_config.json,
	// chat_template.jinja, ...).
	Files []string `json:"files,omitempty"`
	// SHA256 is the hex SHA-256 over the files in Files order, each as its
	// name, a NUL byte, its length as 8 little-endian bytes and its bytes;
	// a router checks it before using what it fetched.
	SHA256 string `json:"sha256,omitempty"`
}

// ModelCard is one entry of an engine's /v1/models.
type ModelCard struct {
	ID          string `json:"id"`
	Root        string `json:"root,omitempty"`
	Parent      string `json:"parent,omitempty"` // set for a LoRA adapter
	Created     int64  `json:"created,omitempty"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
}

// MaxModelCards bounds a registration's cards.
const MaxModelCards = 4096

// SaltName is the name the worker's base-model blocks are hashed under.
func (w *WorkerInfo) SaltName() string {
	if w.Salt != "" {
		return w.Salt
	}
	return w.Model
}

// Serves reports whether the worker serves the model name (Model or one of
// Models).
func (w *WorkerInfo) Serves(model string) bool {
	if w.Model == model {
		return true
	}
	for _, m := range w.Models {
		if m == model {
			return true
		}
	}
	return false
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
	case w.MaxModelLen < 0:
		return fmt.Errorf("%w: worker %s max_model_len %d", ErrMalformed, w.ID, w.MaxModelLen)
	case w.DPSize < 0 || w.DPRank < 0 || w.DPSize > 0 && w.DPRank >= w.DPSize || w.DPSize == 0 && w.DPRank != 0:
		return fmt.Errorf("%w: worker %s dp_rank %d of dp_size %d", ErrMalformed, w.ID, w.DPRank, w.DPSize)
	case w.Role != "" && w.Role != RoleBoth && w.Role != RolePrefill && w.Role != RoleDecode:
		return fmt.Errorf("%w: worker %s role %q (want prefill, decode or both)", ErrMalformed, w.ID, w.Role)
	case w.KVTransfer != "" && w.KVTransfer != TransferVLLM && w.KVTransfer != TransferSGLang:
		return fmt.Errorf("%w: worker %s kv_transfer %q (want vllm or sglang)", ErrMalformed, w.ID, w.KVTransfer)
	case w.RoleOf() != RoleBoth && w.KVTransfer == "":
		return fmt.Errorf("%w: worker %s has role %s but no kv_transfer protocol", ErrMalformed, w.ID, w.Role)
	case w.BootstrapPort < 0 || w.BootstrapPort > 65535:
		return fmt.Errorf("%w: worker %s bootstrap_port %d", ErrMalformed, w.ID, w.BootstrapPort)
	}
	for tier, n := range w.TierBlocks {
		if (tier != "cpu" && tier != "disk") || n <= 0 {
			return fmt.Errorf("%w: worker %s tier_blocks %s=%d (want cpu or disk, positive)", ErrMalformed, w.ID, tier, n)
		}
	}
	for _, m := range w.Models {
		if m == "" {
			return fmt.Errorf("%w: worker %s has an empty model name in models", ErrMalformed, w.ID)
		}
	}
	if len(w.Cards) > MaxModelCards {
		return fmt.Errorf("%w: worker %s has %d model cards", ErrMalformed, w.ID, len(w.Cards))
	}
	for _, c := range w.Cards {
		if c.ID == "" || c.MaxModelLen < 0 {
			return fmt.Errorf("%w: worker %s has a model card without an id or with a negative max_model_len", ErrMalformed, w.ID)
		}
	}
	if t := w.Tokenizer; t != nil && t.Spec == "" && (t.URL == "" || len(t.Files) == 0 || len(t.SHA256) != 64) {
		return fmt.Errorf("%w: worker %s tokenizer source needs a spec, or a url, files and a sha256", ErrMalformed, w.ID)
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
	// AdminAddr is host:port of the admin listener (/metrics,
	// /debug/cluster, the operators' page); "" when they are on HTTPAddr.
	AdminAddr string `json:"admin_addr,omitempty"`
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

// CheckAdvertiseURL reports why s cannot be a registered base URL: it must be
// http:// or https:// with a host, and https:// when the server serves TLS
// (secure), or routers would speak plain HTTP to a TLS port. An https://
// URL for a plaintext server is allowed: TLS may end in front of it.
func CheckAdvertiseURL(s string, secure bool) error {
	u, err := url.Parse(s)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("%q is not an http(s) URL", s)
	case secure && u.Scheme != "https":
		return fmt.Errorf("%q is not https:// but the server serves TLS", s)
	}
	return nil
}

// AdvertiseURL is the base URL (WorkerInfo.URL, TokenizerSource.URL) that a
// server listening at a registers: its address, or, for a listener on every
// interface, the machine's host name (127.0.0.1 if it has none) so that other
// hosts can reach it. The scheme is https when the server serves TLS
// (secure), else http.
func AdvertiseURL(a *net.TCPAddr, secure bool) string {
	host := a.IP.String()
	if a.IP.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		} else {
			host = "127.0.0.1"
		}
	}
	scheme := "http://"
	if secure {
		scheme = "https://"
	}
	return scheme + net.JoinHostPort(host, fmt.Sprint(a.Port))
}
