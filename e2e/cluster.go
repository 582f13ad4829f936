package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"time"
)

// ErrMalformedClusterInfo is wrapped when a /debug/cluster body is not the
// document a router serves.
var ErrMalformedClusterInfo = errors.New("malformed /debug/cluster document")

// ClusterInfo is the part of a router's /debug/cluster the suite reads.
type ClusterInfo struct {
	Self     string `json:"self"`
	Degraded bool   `json:"degraded"`
	Replicas []struct {
		ID    string `json:"ID"`
		Ready bool   `json:"Ready"`
	} `json:"replicas"`
	Owners map[string]struct {
		Replica string `json:"replica"`
		Epoch   int64  `json:"epoch"`
	} `json:"owners"`
	Workers []struct {
		ID string `json:"ID"`
	} `json:"workers"`
}

// DecodeClusterInfo parses a /debug/cluster body. It requires the fields
// the suite depends on (self, owners) so a changed format fails loudly.
func DecodeClusterInfo(raw []byte) (ClusterInfo, error) {
	var ci ClusterInfo
	if err := json.Unmarshal(raw, &ci); err != nil {
		return ClusterInfo{}, fmt.Errorf("%w: %v", ErrMalformedClusterInfo, err)
	}
	if ci.Self == "" {
		return ClusterInfo{}, fmt.Errorf("%w: no self", ErrMalformedClusterInfo)
	}
	if ci.Owners == nil {
		return ClusterInfo{}, fmt.Errorf("%w: no owners", ErrMalformedClusterInfo)
	}
	return ci, nil
}

// FetchClusterInfo GETs base+/debug/cluster.
func FetchClusterInfo(ctx context.Context, client *http.Client, base string) (ClusterInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/cluster", nil)
	if err != nil {
		return ClusterInfo{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return ClusterInfo{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return ClusterInfo{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return ClusterInfo{}, fmt.Errorf("%s/debug/cluster: status %d", base, resp.StatusCode)
	}
	return DecodeClusterInfo(raw)
}

// OwnerOf is the replica owning class in ci ("" if none).
func (ci ClusterInfo) OwnerOf(class string) string { return ci.Owners[class].Replica }

// Settled reports whether the cluster views agree on a complete ownership
// map whose owners are all among live, with the wanted number of ready
// replicas and workers, and none of them in degraded mode. It returns what
// is not settled yet, for the failure message.
func Settled(views []ClusterInfo, live []string, classes []string, workers int) (bool, string) {
	if len(views) != len(live) {
		return false, fmt.Sprintf("%d of %d live routers answered", len(views), len(live))
	}
	isLive := map[string]bool{}
	for _, id := range live {
		isLive[id] = true
	}
	ref := views[0]
	for _, v := range views {
		if v.Degraded {
			return false, v.Self + " is degraded"
		}
		ready := 0
		for _, r := range v.Replicas {
			if r.Ready && isLive[r.ID] {
				ready++
			}
		}
		if ready != len(live) {
			return false, fmt.Sprintf("%s sees %d of %d live replicas ready", v.Self, ready, len(live))
		}
		if len(v.Workers) != workers {
			return false, fmt.Sprintf("%s sees %d of %d workers", v.Self, len(v.Workers), workers)
		}
		for _, c := range classes {
			o, ok := v.Owners[c]
			switch {
			case !ok || o.Replica == "":
				return false, fmt.Sprintf("%s sees no owner of %s", v.Self, c)
			case !isLive[o.Replica]:
				return false, fmt.Sprintf("%s sees dead %s owning %s", v.Self, o.Replica, c)
			case o != ref.Owners[c]:
				return false, fmt.Sprintf("%s and %s disagree on %s", v.Self, ref.Self, c)
			}
		}
	}
	return true, ""
}

// OwnerSummary renders an ownership map as "class=replica" pairs, sorted.
func OwnerSummary(ci ClusterInfo) string {
	var out []string
	for c, o := range ci.Owners {
		out = append(out, fmt.Sprintf("%s=%s", c, o.Replica))
	}
	sort.Strings(out)
	return fmt.Sprint(out)
}
