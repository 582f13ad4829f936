package app

import (
	"context"
	"encoding/json"
	"slices"
	"sort"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/frontend"
	"github.com/switchyard/switchyard/gossip"
	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/scheduler"
)

// clusterInfo serves /debug/cluster: the replica's view of the cluster as
// one JSON document (replicas, class owners, workers with this replica's
// and the others' load, gossip members, class snapshots, tokenizers).
func clusterInfo(id string, reps *cluster.Replicas, ws *cluster.Workers, own *cluster.Ownership, actor *scheduler.Actor, g *gossip.Gossip, client *admission.Client, prompts *prompt.Registry) frontend.ClusterInfoFunc {
	return func(context.Context) (json.RawMessage, error) {
		type replica struct {
			ID, HTTPAddr, GossipAddr string
			Ready                    bool
		}
		type worker struct {
			ID, URL, Model      string
			Models              []string `json:",omitempty"`
			BlockSize, KVBlocks int
			LocalLoad           scheduler.WorkerLoad
			RemoteLoad          gossip.WorkerLoad
		}
		type owner struct {
			Replica string `json:"replica"`
			Epoch   int64  `json:"epoch"`
		}
		doc := struct {
			Self     string                             `json:"self"`
			Degraded bool                               `json:"degraded"`
			Replicas []replica                          `json:"replicas"`
			Owners   map[string]owner                   `json:"owners"`
			Workers  []worker                           `json:"workers"`
			Members  []gossip.Member                    `json:"gossip_members"`
			Classes  map[string]scheduler.ClassSnapshot `json:"classes"`
			// Tokenizers are each known model's tokenizer: its source,
			// spec, path (local, fetched; engine|approximate while it has
			// none), digest and last load error.
			Tokenizers []prompt.ModelInfo `json:"tokenizers"`
		}{Self: id, Degraded: client.Degraded(), Owners: map[string]owner{}, Tokenizers: prompts.Info()}
		for _, r := range reps.Snapshot().Items {
			doc.Replicas = append(doc.Replicas, replica{r.Info.ID, r.Info.HTTPAddr, r.Info.GossipAddr, r.Info.Ready})
		}
		sort.Slice(doc.Replicas, func(i, j int) bool { return doc.Replicas[i].ID < doc.Replicas[j].ID })
		for class, o := range own.Owners() {
			doc.Owners[class] = owner{o.Replica, o.Epoch}
		}
		snap := actor.Snapshot()
		for _, it := range ws.Snapshot().Items {
			doc.Workers = append(doc.Workers, worker{it.Info.ID, it.Info.URL, it.Info.Model, it.Info.Models, it.Info.BlockSize, it.Info.KVBlocks,
				snap.Workers[it.Info.ID], g.RemoteLoad(it.Info.ID)})
		}
		slices.SortFunc(doc.Workers, func(a, b worker) int {
			if a.ID < b.ID {
				return -1
			}
			if a.ID > b.ID {
				return 1
			}
			return 0
		})
		doc.Members = g.Members()
		doc.Classes = snap.Classes
		b, err := json.Marshal(doc)
		return b, err
	}
}
