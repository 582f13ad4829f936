package adapter

import (
	"fmt"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// Data-parallel engines. vLLM run with --data-parallel-size N serves one
// API server in front of N engine cores (ranks), each with its own KV cache
// and its own KV event publisher: rank r binds the configured endpoint's
// port + r (ZmqEventPublisher.offset_endpoint_port) and stamps r as
// data_parallel_rank in every batch. A request's rank is chosen by the
// API server unless the X-data-parallel-rank header names one.
//
// One adapter fronts one rank (-dp-rank r -dp-size N, the same -id and
// -kv-events for every rank): it registers the worker ID-dp<r> at the API
// server's URL with the rank in its record, follows port + r, and routers
// route to the rank as to any worker, sending the header with the request.
// Its load reports count only the API server's series labelled
// engine="<rank>" (vLLM labels each engine core's metrics so).

// DPRankHeader is the request header that pins a vLLM data-parallel rank.
const DPRankHeader = "X-data-parallel-rank"

func (c Config) validateDP() error {
	switch {
	case c.DPSize < 0:
		return fmt.Errorf("%w: dp-size %d must not be negative", ErrInvalidConfig, c.DPSize)
	case c.DPSize <= 1 && c.DPRank != 0:
		return fmt.Errorf("%w: dp-rank %d needs dp-size > 1", ErrInvalidConfig, c.DPRank)
	case c.DPRank < 0 || c.DPSize > 1 && c.DPRank >= c.DPSize:
		return fmt.Errorf("%w: dp-rank %d must be in [0, dp-size %d)", ErrInvalidConfig, c.DPRank, c.DPSize)
	}
	return nil
}

// DPWorkerID is the worker id of rank r of the engine an adapter calls id.
func DPWorkerID(id string, r int) string { return id + "-dp" + strconv.Itoa(r) }

// forRank is c as the adapter of its rank runs it: the rank's worker id
// and event endpoints. Without data parallelism it is c.
func (c Config) forRank() (Config, error) {
	if c.DPSize <= 1 {
		return c, nil
	}
	c.ID = DPWorkerID(c.ID, c.DPRank)
	var err error
	if c.KVEvents, err = offsetPort(c.KVEvents, c.DPRank); err != nil {
		return c, err
	}
	if c.KVReplay, err = offsetPort(c.KVReplay, c.DPRank); err != nil {
		return c, err
	}
	return c, nil
}

// offsetPort moves a tcp:// endpoint's port up by r, as vLLM's publisher of
// rank r binds it; other transports get vLLM's "_dp<r>" suffix.
func offsetPort(ep string, r int) (string, error) {
	if ep == "" || r == 0 {
		return ep, nil
	}
	if !strings.HasPrefix(ep, "tcp://") {
		return ep + "_dp" + strconv.Itoa(r), nil // ipc:// and inproc:// have no port
	}
	i := strings.LastIndexByte(ep, ':')
	port, err := strconv.Atoi(ep[i+1:])
	if i < len("tcp://") || err != nil || port <= 0 || port+r > 65535 {
		return "", fmt.Errorf("%w: kv endpoint %q has no port that rank %d can offset", ErrInvalidConfig, ep, r)
	}
	return ep[:i+1] + strconv.Itoa(port+r), nil
}

// onlyEngine keeps, in every family, the samples labelled engine=rank.
func onlyEngine(fams map[string]*dto.MetricFamily, rank string) {
	for _, f := range fams {
		kept := f.Metric[:0]
		for _, m := range f.Metric {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "engine" && lp.GetValue() == rank {
					kept = append(kept, m)
					break
				}
			}
		}
		f.Metric = kept
	}
}

// rank is the load reporter's engine label: the rank with data
// parallelism, "" (every engine) without.
func (c Config) rank() string {
	if c.DPSize <= 1 {
		return ""
	}
	return strconv.Itoa(c.DPRank)
}
