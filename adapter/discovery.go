package adapter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/switchyard/switchyard/wire"
)

// Sanity bounds on what an engine reports. Anything beyond is treated as a
// malformed answer: a registration with absurd numbers would mislead every
// router.
const (
	maxBlockSize   = 1 << 16
	maxKVBlocks    = 1 << 31 / 2
	maxModelLen    = 1 << 31 / 2
	maxModelNames  = 4096
	maxNameLen     = 1024
	maxQueueLength = 1 << 30
)

// Models is what an OpenAI-compatible /v1/models answer says.
type Models struct {
	// Base is the first served model without a parent: the name blocks
	// without a LoRA adapter are hashed under.
	Base string
	// Others are the further names: the base model's aliases (vLLM lists
	// every --served-model-name) and the LoRA adapters (entries with a
	// parent), in the engine's order.
	Others []string
	// LoRAs are the entries with a parent (a subset of Others).
	LoRAs []string
	// MaxModelLen is the base entry's max_model_len (0: not given).
	MaxModelLen int
	// Root is the base entry's root: the weights it serves (vLLM names
	// the model path), the same under every alias ("" when not given).
	Root string
	// Cards are the entries as given, for routers' /v1/models.
	Cards []wire.ModelCard
}

type modelCard struct {
	ID          string          `json:"id"`
	Parent      *string         `json:"parent"`
	Root        *string         `json:"root"`
	Created     json.RawMessage `json:"created"`
	MaxModelLen json.RawMessage `json:"max_model_len"`
}

// ParseModels decodes a /v1/models answer (vLLM, SGLang, any
// OpenAI-compatible server). Errors wrap ErrMalformed.
func ParseModels(body []byte) (Models, error) {
	var list struct {
		Data []modelCard `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return Models{}, fmt.Errorf("%w: /v1/models: %v", ErrMalformed, err)
	}
	if len(list.Data) == 0 {
		return Models{}, fmt.Errorf("%w: /v1/models lists no model", ErrMalformed)
	}
	if len(list.Data) > maxModelNames {
		return Models{}, fmt.Errorf("%w: /v1/models lists %d models", ErrMalformed, len(list.Data))
	}
	var out Models
	seen := map[string]bool{}
	for i, c := range list.Data {
		if c.ID == "" || len(c.ID) > maxNameLen || strings.ContainsAny(c.ID, "\x00\n") {
			return Models{}, fmt.Errorf("%w: /v1/models entry %d has id %q", ErrMalformed, i, truncate(c.ID))
		}
		if seen[c.ID] {
			continue
		}
		seen[c.ID] = true
		isLoRA := c.Parent != nil && *c.Parent != "" && *c.Parent != c.ID
		card, err := c.card()
		if err != nil {
			return Models{}, err
		}
		out.Cards = append(out.Cards, card)
		if out.Base == "" && !isLoRA {
			out.Base, out.MaxModelLen, out.Root = c.ID, card.MaxModelLen, card.Root
			continue
		}
		out.Others = append(out.Others, c.ID)
		if isLoRA {
			out.LoRAs = append(out.LoRAs, c.ID)
		}
	}
	if out.Base == "" {
		// Only LoRA entries: their parent is the base.
		out.Base = *list.Data[0].Parent
		if len(out.Base) > maxNameLen {
			return Models{}, fmt.Errorf("%w: /v1/models parent %q", ErrMalformed, truncate(out.Base))
		}
	}
	return out, nil
}

// card is the entry as routers pass it through; a root or parent longer
// than a name may be is dropped rather than refused (it is shown, not
// routed on), a created that is no count is dropped too.
func (c *modelCard) card() (wire.ModelCard, error) {
	n, err := optionalCount(c.MaxModelLen, maxModelLen)
	if err != nil {
		return wire.ModelCard{}, fmt.Errorf("%w: /v1/models %s max_model_len: %v", ErrMalformed, c.ID, err)
	}
	out := wire.ModelCard{ID: c.ID, MaxModelLen: n}
	if c.Root != nil && len(*c.Root) <= maxNameLen {
		out.Root = *c.Root
	}
	if c.Parent != nil && *c.Parent != c.ID && len(*c.Parent) <= maxNameLen {
		out.Parent = *c.Parent
	}
	if t, err := optionalCount(c.Created, 1<<40); err == nil {
		out.Created = int64(t)
	}
	return out, nil
}

// optionalCount reads a JSON number that may be absent or null; it must be a
// whole number in [0, limit].
func optionalCount(raw json.RawMessage, limit int) (int, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		return 0, err
	}
	return wholeCount(f, limit)
}

func wholeCount(f float64, limit int) (int, error) {
	if math.IsNaN(f) || f < 0 || f > float64(limit) || f != math.Trunc(f) {
		return 0, fmt.Errorf("%v is not a count in [0, %d]", f, limit)
	}
	return int(f), nil
}

// CacheConfig is what vLLM's vllm:cache_config_info metric says.
type CacheConfig struct {
	BlockSize    int
	NumGPUBlocks int
}

// parseFamilies reads the Prometheus text format. The parser reports bad
// input as errors; a recover turns a parser panic on hostile input into one
// too, because a scrape must never take the adapter down.
func parseFamilies(text []byte) (fams map[string]*dto.MetricFamily, err error) {
	defer func() {
		if r := recover(); r != nil {
			fams, err = nil, fmt.Errorf("%w: metrics text: parser panic: %v", ErrMalformed, r)
		}
	}()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err = p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("%w: metrics text: %v", ErrMalformed, err)
	}
	return fams, nil
}

// ParseCacheConfig finds vllm:cache_config_info in a vLLM /metrics answer
// and reads its block_size and num_gpu_blocks labels. Errors wrap
// ErrMalformed.
func ParseCacheConfig(text []byte) (CacheConfig, error) {
	fams, err := parseFamilies(text)
	if err != nil {
		return CacheConfig{}, err
	}
	f := fams["vllm:cache_config_info"]
	if f == nil || len(f.GetMetric()) == 0 {
		return CacheConfig{}, fmt.Errorf("%w: no vllm:cache_config_info in the metrics", ErrMalformed)
	}
	var c CacheConfig
	for _, lp := range f.GetMetric()[0].GetLabel() {
		switch lp.GetName() {
		case "block_size":
			if c.BlockSize, err = labelCount(lp.GetValue(), maxBlockSize); err != nil {
				return CacheConfig{}, fmt.Errorf("%w: cache_config_info block_size: %v", ErrMalformed, err)
			}
		case "num_gpu_blocks":
			if c.NumGPUBlocks, err = labelCount(lp.GetValue(), maxKVBlocks); err != nil {
				return CacheConfig{}, fmt.Errorf("%w: cache_config_info num_gpu_blocks: %v", ErrMalformed, err)
			}
		}
	}
	return c, nil
}

// labelCount reads a count from a label value; vLLM writes "None" for
// values not known yet, which reads as 0.
func labelCount(v string, limit int) (int, error) {
	if v == "" || v == "None" {
		return 0, nil
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, err
	}
	return wholeCount(n, limit)
}

// ServerInfo is what SGLang's /get_server_info (or /server_info) says: its
// server arguments with the scheduler's numbers merged in.
type ServerInfo struct {
	ServedModelName string
	PageSize        int
	// MaxTotalNumTokens is the KV pool's size in tokens.
	MaxTotalNumTokens int
	ContextLength     int
	MaxRunning        int
	ChunkedPrefill    int
	// Role is disaggregation_mode as a wire role ("" for null or absent);
	// BootstrapPort is disaggregation_bootstrap_port.
	Role          string
	BootstrapPort int
}

// KVBlocks is the pool size in pages.
func (s ServerInfo) KVBlocks() int {
	if s.PageSize <= 0 {
		return 0
	}
	return s.MaxTotalNumTokens / s.PageSize
}

// ParseServerInfo decodes SGLang's server-info answer. Older versions
// put max_total_num_tokens at the top level (from the scheduler info),
// others only in internal_states[0]; both are read. Errors wrap
// ErrMalformed.
func ParseServerInfo(body []byte) (ServerInfo, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return ServerInfo{}, fmt.Errorf("%w: server info: %v", ErrMalformed, err)
	}
	if raw == nil {
		return ServerInfo{}, fmt.Errorf("%w: server info is null", ErrMalformed)
	}
	var s ServerInfo
	var err error
	if v, ok := raw["served_model_name"]; ok {
		var name any
		if err := json.Unmarshal(v, &name); err != nil {
			return ServerInfo{}, fmt.Errorf("%w: server info served_model_name: %v", ErrMalformed, err)
		}
		switch n := name.(type) {
		case string:
			s.ServedModelName = n
		case []any: // some versions accept several names
			if len(n) > 0 {
				s.ServedModelName, _ = n[0].(string)
			}
		}
	}
	if s.ServedModelName == "" {
		var p string
		if v, ok := raw["model_path"]; ok && json.Unmarshal(v, &p) == nil {
			s.ServedModelName = p
		}
	}
	if len(s.ServedModelName) > maxNameLen {
		return ServerInfo{}, fmt.Errorf("%w: server info model name of %d bytes", ErrMalformed, len(s.ServedModelName))
	}
	fields := []struct {
		key   string
		dst   *int
		limit int
	}{
		{"page_size", &s.PageSize, maxBlockSize},
		{"max_total_num_tokens", &s.MaxTotalNumTokens, maxKVBlocks},
		{"context_length", &s.ContextLength, maxModelLen},
		{"max_running_requests", &s.MaxRunning, maxQueueLength},
		{"chunked_prefill_size", &s.ChunkedPrefill, maxModelLen},
	}
	for _, f := range fields {
		if *f.dst, err = optionalCount(raw[f.key], f.limit); err != nil {
			if f.key == "chunked_prefill_size" || f.key == "max_running_requests" {
				// SGLang uses -1 for "no limit": read it as unknown.
				*f.dst = 0
				continue
			}
			return ServerInfo{}, fmt.Errorf("%w: server info %s: %v", ErrMalformed, f.key, err)
		}
	}
	var mode string
	if v, ok := raw["disaggregation_mode"]; ok && json.Unmarshal(v, &mode) == nil {
		switch mode {
		case wire.RolePrefill, wire.RoleDecode:
			s.Role = mode
		}
	}
	if s.Role != "" {
		if s.BootstrapPort, err = optionalCount(raw["disaggregation_bootstrap_port"], 65535); err != nil {
			return ServerInfo{}, fmt.Errorf("%w: server info disaggregation_bootstrap_port: %v", ErrMalformed, err)
		}
	}
	if s.MaxTotalNumTokens == 0 {
		var states []map[string]json.RawMessage
		if v, ok := raw["internal_states"]; ok && json.Unmarshal(v, &states) == nil && len(states) > 0 {
			if s.MaxTotalNumTokens, err = optionalCount(states[0]["max_total_num_tokens"], maxKVBlocks); err != nil {
				return ServerInfo{}, fmt.Errorf("%w: server info internal_states max_total_num_tokens: %v", ErrMalformed, err)
			}
		}
	}
	return s, nil
}

// Flavor says which engine's metric names a load scrape reads.
type Flavor uint8

// Metric flavors.
const (
	FlavorVLLM Flavor = iota + 1
	FlavorSGLang
)

func (f Flavor) String() string {
	switch f {
	case FlavorVLLM:
		return "vllm"
	case FlavorSGLang:
		return "sglang"
	}
	return fmt.Sprintf("flavor(%d)", uint8(f))
}

// Load is one scrape's engine load.
type Load struct {
	Running, Waiting int
	// KVUsage is the fraction of the KV pool in use, 0..1.
	KVUsage float64
	// HasUsage is false when the engine exported no usage gauge.
	HasUsage bool
	// PrefixHitRate is the engine's own prefix-cache hit rate, 0..1 (0:
	// not exported): vLLM's prefix_cache_hits / prefix_cache_queries
	// counters (cumulative, in tokens), else vLLM V0's
	// gpu_prefix_cache_hit_rate or SGLang's cache_hit_rate gauge.
	PrefixHitRate float64
}

// hitNames are, per flavor, the counters of prefix-cache hits and queries
// (each under its exposed name with _total and its family name) and the
// hit-rate gauges read when the counters are absent.
var hitNames = map[Flavor]struct {
	hits, queries []string
	rate          []string
}{
	FlavorVLLM: {hits: []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"},
		queries: []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"},
		rate:    []string{"vllm:gpu_prefix_cache_hit_rate"}},
	FlavorSGLang: {rate: []string{"sglang:cache_hit_rate"}},
}

// prefixHitRate reads hitNames of flavor f from fams (0 when absent; a
// value out of range is an error).
func prefixHitRate(fams map[string]*dto.MetricFamily, f Flavor) (float64, error) {
	names := hitNames[f]
	first := func(ns []string) *dto.MetricFamily {
		for _, n := range ns {
			if fam := fams[n]; fam != nil {
				return fam
			}
		}
		return nil
	}
	sum := func(fam *dto.MetricFamily) (float64, bool) {
		total, seen := 0.0, false
		for _, m := range fam.GetMetric() {
			if v, ok := sampleValue(m); ok && !math.IsNaN(v) && v >= 0 && !math.IsInf(v, 0) {
				total, seen = total+v, true
			}
		}
		return total, seen
	}
	if h, q := first(names.hits), first(names.queries); h != nil && q != nil {
		hits, ok1 := sum(h)
		queries, ok2 := sum(q)
		if !ok1 || !ok2 || queries == 0 {
			return 0, nil
		}
		if hits > queries*1.0001 {
			return 0, fmt.Errorf("%w: %s %v exceeds %s %v", ErrMalformed, h.GetName(), hits, q.GetName(), queries)
		}
		return min(hits/queries, 1), nil
	}
	if g := first(names.rate); g != nil {
		total, n := 0.0, 0
		for _, m := range g.GetMetric() {
			v, ok := sampleValue(m)
			if !ok {
				continue
			}
			if math.IsNaN(v) || v < 0 || v > 1.0001 {
				return 0, fmt.Errorf("%w: %s = %v is not a fraction", ErrMalformed, g.GetName(), v)
			}
			total, n = total+v, n+1
		}
		if n > 0 {
			return min(total/float64(n), 1), nil
		}
	}
	return 0, nil
}

type loadNames struct{ running, waiting, usage, usageOld string }

var flavorNames = map[Flavor]loadNames{
	FlavorVLLM:   {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
	FlavorSGLang: {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", ""},
}

// ParseLoadMetrics reads an engine's load from its Prometheus text: request
// counts are summed over every label set (several models or data-parallel
// ranks), the usage fraction is their mean. The running and waiting counts
// must be present. Errors wrap ErrMalformed.
func ParseLoadMetrics(text []byte, f Flavor) (Load, error) {
	return parseLoadRank(text, f, "")
}

// parseLoadRank is ParseLoadMetrics of one data-parallel rank: vLLM labels
// each engine core's series engine="<rank>", and with rank set only those
// count; "" sums every engine.
func parseLoadRank(text []byte, f Flavor, rank string) (Load, error) {
	names, ok := flavorNames[f]
	if !ok {
		return Load{}, fmt.Errorf("%w: unknown metrics flavor %v", ErrInvalidConfig, f)
	}
	fams, err := parseFamilies(text)
	if err != nil {
		return Load{}, err
	}
	if rank != "" {
		onlyEngine(fams, rank)
	}
	var l Load
	var ok1, ok2 bool
	if l.Running, ok1, err = sumCount(fams[names.running]); err != nil {
		return Load{}, err
	}
	if l.Waiting, ok2, err = sumCount(fams[names.waiting]); err != nil {
		return Load{}, err
	}
	if !ok1 || !ok2 {
		return Load{}, fmt.Errorf("%w: metrics lack %s or %s", ErrMalformed, names.running, names.waiting)
	}
	usage := fams[names.usage]
	if usage == nil && names.usageOld != "" {
		usage = fams[names.usageOld]
	}
	if usage != nil {
		var sum float64
		n := 0
		for _, m := range usage.GetMetric() {
			v, ok := sampleValue(m)
			if !ok {
				continue
			}
			if math.IsNaN(v) || v < 0 || v > 1.0001 {
				return Load{}, fmt.Errorf("%w: %s = %v is not a fraction", ErrMalformed, usage.GetName(), v)
			}
			sum += v
			n++
		}
		if n > 0 {
			l.KVUsage, l.HasUsage = min(sum/float64(n), 1), true
		}
	}
	if l.PrefixHitRate, err = prefixHitRate(fams, f); err != nil {
		return Load{}, err
	}
	return l, nil
}

func sampleValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

// sumCount sums a family's samples, each a whole count in range.
func sumCount(f *dto.MetricFamily) (int, bool, error) {
	if f == nil {
		return 0, false, nil
	}
	total, seen := 0, false
	for _, m := range f.GetMetric() {
		v, ok := sampleValue(m)
		if !ok {
			continue
		}
		n, err := wholeCount(v, maxQueueLength)
		if err != nil {
			return 0, false, fmt.Errorf("%w: %s: %v", ErrMalformed, f.GetName(), err)
		}
		total += n
		if total > maxQueueLength {
			return 0, false, fmt.Errorf("%w: %s sums beyond %d", ErrMalformed, f.GetName(), maxQueueLength)
		}
		seen = true
	}
	return total, seen, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
