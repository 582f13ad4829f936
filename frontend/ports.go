package frontend

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// Admitter decides when and where a request runs. The local implementation
// (LocalAdmitter) calls a scheduler.Actor in-process; a remote one sends the
// request to the class owner over NATS. Admit blocks while the request is
// queued; cancelling ctx withdraws it. Errors wrap the scheduler sentinels
// (scheduler.ErrQueueFull, ErrDeadlineExceeded, ...).
type Admitter interface {
	Admit(ctx context.Context, r *scheduler.Request) (Ticket, error)
}

// Ticket is an admitted request's booking. The frontend calls Dispatched once
// it has taken the grant (while the request to the worker is already on its
// way), FirstToken once the worker's first output has been flushed to the
// client, and Finish exactly once at the end (aborted when the stream did not
// complete normally). Implementations must be safe to call from the request
// goroutine and must not block on the network for long.
type Ticket interface {
	Grant() scheduler.Grant
	Dispatched()
	FirstToken()
	Finish(aborted bool)
}

// WorkerView is the frontend's read-only view of the worker registry.
type WorkerView interface {
	// Workers returns the registered workers; the slice must not be mutated.
	Workers() []WorkerEntry
}

// WorkerEntry is what the frontend needs to know about one worker.
type WorkerEntry struct {
	ID        string
	URL       string
	Model     string
	BlockSize int
	// Models are further names the worker serves (wire.WorkerInfo.Models).
	Models []string
	// MaxModelLen is the engine's context length in tokens (0: unknown):
	// what a request without max_tokens may generate, less its prompt.
	MaxModelLen int
	// Salt is the name the worker's base-model blocks are hashed under
	// (wire.WorkerInfo.Salt: the engine's model root); "": Model.
	Salt string
	// Cards are the engine's /v1/models entries (wire.WorkerInfo.Cards).
	Cards []wire.ModelCard
	// PrioritySchedules: the engine takes vLLM's priority field
	// (wire.WorkerInfo.PrioritySchedules).
	PrioritySchedules bool
	// DPRank and DPSize: with DPSize > 1 the worker is one rank of a
	// data-parallel engine, pinned with the X-data-parallel-rank header.
	DPRank, DPSize int
	// Messages is set when the engine serves Anthropic's Messages API
	// itself (wire.APIMessages): the router forwards such requests as
	// they are, and translates them to chat completions for the others.
	Messages bool
	// Role is the worker's part in a disaggregated fleet (wire.RoleBoth,
	// "" reads as both; wire.RolePrefill, wire.RoleDecode), KVTransfer the
	// protocol its engine moves KV with (wire.TransferVLLM,
	// wire.TransferSGLang) and BootstrapPort an SGLang prefill server's
	// bootstrap port (disagg.go).
	Role          string
	KVTransfer    string
	BootstrapPort int
}

// saltFor is the name a prompt for model is hashed under on w: a LoRA
// adapter's own name (its blocks are seeded so), else the worker's salt
// (its engine's root) or base model. A worker registered without cards
// cannot tell a LoRA from an alias: the request's name, as before.
func (w *WorkerEntry) saltFor(model string) string {
	if len(w.Cards) == 0 {
		return model
	}
	for i := range w.Cards {
		if c := &w.Cards[i]; c.ID == model && c.Parent != "" {
			return model
		}
	}
	if w.Salt != "" {
		return w.Salt
	}
	return w.Model
}

// Serves reports whether the worker serves the model name.
func (w *WorkerEntry) Serves(model string) bool {
	return w.Model == model || slices.Contains(w.Models, model)
}

// PrefixIndex answers prefix-cache overlaps for a prompt's sequence hashes.
type PrefixIndex interface {
	// Overlaps appends to dst every worker's matched prefix depth, in blocks,
	// for seqHashes and returns it. Workers with no match may be omitted.
	Overlaps(dst []scheduler.Overlap, seqHashes []uint64) []scheduler.Overlap
	// Predict records that worker is about to hold seqHashes (the routing
	// decision), until the engine's own events confirm or expire it.
	Predict(worker string, seqHashes []uint64)
}

// ReadyFunc reports whether the replica can serve (registries and index are
// loaded). A nil error means ready; the error text explains what is missing.
type ReadyFunc func() error

// ClusterInfoFunc returns the JSON document served at /debug/cluster
// (replicas, class owners, workers, projected loads).
type ClusterInfoFunc func(ctx context.Context) (json.RawMessage, error)

// Prompts turns a request's prompt into the model's token ids, exactly as
// the model's engines do (*prompt.Registry). engines are the base URLs of
// the workers serving the model, for a registry that may ask one of them.
// Errors are the client's (prompt.ErrBadRequest, prompt.ErrRender).
type Prompts interface {
	Tokenize(ctx context.Context, model string, in *prompt.Input, engines []string) (prompt.Result, error)
}

// Suspects shares worker suspicion between replicas (gossip in a
// replica). Every method must be cheap and safe for concurrent use:
// Suspected runs on every successful request.
type Suspects interface {
	// Suspect marks worker suspect from now on, for every replica.
	Suspect(worker string)
	// Recovered reports a request to worker that succeeded: it clears the
	// worker's suspicion everywhere.
	Recovered(worker string)
	// Suspected reports whether some replica suspects worker now.
	Suspected(worker string) bool
}
