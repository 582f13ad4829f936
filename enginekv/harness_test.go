package enginekv

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/internal/testenv"
)

// item is one thing a recorder saw: a batch or a reset.
type recItem struct {
	batch *Batch
	reset ResetReason
}

// recorder is a Handler that keeps what it is given.
type recorder struct {
	mu    sync.Mutex
	items []recItem
}

func (r *recorder) Batch(b Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, recItem{batch: &b})
}

func (r *recorder) Reset(reason ResetReason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, recItem{reset: reason})
}

func (r *recorder) snapshot() []recItem {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recItem(nil), r.items...)
}

func (r *recorder) batches() int {
	n := 0
	for _, it := range r.snapshot() {
		if it.batch != nil {
			n++
		}
	}
	return n
}

// trace renders what the recorder saw as "0 1 reset:gap 4", for asserting
// order in one comparison.
func (r *recorder) trace() string {
	var parts []string
	for _, it := range r.snapshot() {
		if it.batch != nil {
			parts = append(parts, fmt.Sprint(it.batch.Seq))
		} else {
			parts = append(parts, "reset:"+it.reset.String())
		}
	}
	return strings.Join(parts, " ")
}

func (r *recorder) waitBatches(t *testing.T, n int) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() bool { return r.batches() >= n }, "%d batches (saw %s)", n, stringer(r.trace))
}

type stringer func() string

func (s stringer) String() string { return s() }

// startSubscriber runs a Subscriber until the test ends.
func startSubscriber(t *testing.T, cfg SubscriberConfig) (*recorder, *prometheus.Registry) {
	t.Helper()
	rec := &recorder{}
	return rec, runSubscriber(t, cfg, rec)
}

// runSubscriber runs a Subscriber feeding h until the test ends.
func runSubscriber(t *testing.T, cfg SubscriberConfig, h Handler) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := NewSubscriber(cfg, h, zaptest.NewLogger(t), reg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("subscriber did not stop")
		}
	})
	return reg
}

func subConfig(endpoint, replay string) SubscriberConfig {
	c := DefaultSubscriberConfig()
	c.Endpoint, c.ReplayEndpoint = endpoint, replay
	c.ReplayTimeout = 3 * time.Second
	return c
}

// counter reads the series of a registry's metric name whose label has
// value.
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	return testenv.MetricValue(t, reg, name, map[string]string{label: value})
}

// --- events the scenarios publish ------------------------------------------

// planEvent is an event in pypub.py's plan form.
type planEvent struct {
	Kind      string   `json:"kind"`
	Hashes    []uint64 `json:"hashes,omitempty"`
	Parent    *uint64  `json:"parent"`
	Tokens    []uint32 `json:"tokens,omitempty"`
	BlockSize int      `json:"block_size,omitempty"`
	LoRAID    *int     `json:"lora_id"`
	LoRAName  *string  `json:"lora_name"`
	Medium    string   `json:"medium,omitempty"`
}

func (p planEvent) event() Event {
	switch p.Kind {
	case "stored":
		ev := Event{Kind: BlockStored, BlockHashes: p.Hashes, TokenIDs: p.Tokens, BlockSize: p.BlockSize, Medium: p.Medium}
		if p.Parent != nil {
			ev.ParentHash, ev.HasParent = *p.Parent, true
		}
		if p.LoRAID != nil {
			ev.LoRAID = *p.LoRAID
		}
		if p.LoRAName != nil {
			ev.LoRAName = *p.LoRAName
		}
		return ev
	case "removed":
		return Event{Kind: BlockRemoved, BlockHashes: p.Hashes, Medium: p.Medium}
	}
	return Event{Kind: AllBlocksCleared}
}

// scenarioEvents is the i-th batch's events: a stored chain link with big
// hashes (top bit set, so signed forms are negative), and every third batch
// also a removal.
func scenarioEvents(i int) []planEvent {
	h := uint64(0xF000000000000000) | uint64(i+1)*0x9e3779b97f4a7c15>>4
	toks := make([]uint32, 4)
	for j := range toks {
		toks[j] = uint32(128000 + 4*i + j)
	}
	evs := []planEvent{{Kind: "stored", Hashes: []uint64{h}, Tokens: toks, BlockSize: 4, Medium: "GPU"}}
	if i > 0 {
		p := uint64(0xF000000000000000) | uint64(i)*0x9e3779b97f4a7c15>>4
		evs[0].Parent = &p
	}
	if i%3 == 2 {
		evs = append(evs, planEvent{Kind: "removed", Hashes: []uint64{h, 1}, Medium: "GPU"})
	}
	if i == 4 {
		evs = append(evs, planEvent{Kind: "cleared"})
	}
	return evs
}

func wantEvents(i int) []Event {
	var out []Event
	for _, p := range scenarioEvents(i) {
		out = append(out, p.event())
	}
	return out
}

// requireBatchesMatch checks that every batch the recorder saw carries the
// events scenarioEvents gives for its sequence number (offset: the scenario
// index of seq 0).
func requireBatchesMatch(t *testing.T, rec *recorder, index func(seq uint64) int) {
	t.Helper()
	for _, it := range rec.snapshot() {
		if it.batch == nil {
			continue
		}
		require.Equal(t, wantEvents(index(it.batch.Seq)), it.batch.Events, "batch seq %d", it.batch.Seq)
	}
}

func identity(seq uint64) int { return int(seq) }

// --- the Python publisher ----------------------------------------------------

type pyStep map[string]any

type pyPlan struct {
	Pub            string   `json:"pub"`
	Replay         string   `json:"replay,omitempty"`
	Flavor         string   `json:"flavor"`
	Layout         string   `json:"layout,omitempty"`
	Hashes         string   `json:"hashes,omitempty"`
	ReplyWithTopic bool     `json:"reply_with_topic"`
	Steps          []pyStep `json:"steps"`
}

func batchStep(i int, skipLive bool) pyStep {
	return pyStep{"op": "batch", "skip_live": skipLive, "events": scenarioEvents(i)}
}

// pyPub is a running pypub.py.
type pyPub struct {
	done chan struct{}
}

// needPython skips the test when Debian's python3-zmq or python3-msgpack is
// missing.
func needPython(t *testing.T) {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skipf("the Python fixture needs /usr/bin/python3 with python3-zmq and python3-msgpack (apt-get install python3-zmq python3-msgpack): %v", err)
	}
}

// startPython runs pypub.py with plan and returns once it has bound its
// sockets; it is stopped (its stdin closed) when the test ends.
func startPython(t *testing.T, plan pyPlan) *pyPub {
	t.Helper()
	needPython(t)
	dir := t.TempDir()
	b, err := json.Marshal(plan)
	require.NoError(t, err)
	path := filepath.Join(dir, "plan.json")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	cmd := exec.Command("/usr/bin/python3", "testdata/pypub.py", path)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = &testWriter{t: t}
	require.NoError(t, cmd.Start())
	p := &pyPub{done: make(chan struct{})}
	ready := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			switch sc.Text() {
			case "ready":
				close(ready)
			case "done":
				close(p.done)
			}
		}
		close(exited)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = cmd.Wait()
	})
	select {
	case <-ready:
	case <-exited:
		t.Fatal("pypub.py exited before binding")
	case <-time.After(10 * time.Second):
		t.Fatal("pypub.py did not bind")
	}
	return p
}

func (p *pyPub) waitDone(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Fatal("pypub.py did not finish its plan")
	}
}

// testWriter sends a child's stderr to the test log.
type testWriter struct{ t *testing.T }

func (w *testWriter) Write(b []byte) (int, error) {
	w.t.Logf("pypub.py: %s", strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

var _ io.Writer = (*testWriter)(nil)

func tcp(port int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", port) }

// --- the Go publisher ---------------------------------------------------------

// startPublisher runs a Publisher until the test ends (or stop is called).
func startPublisher(t *testing.T, cfg PublisherConfig) (p *Publisher, stop func()) {
	t.Helper()
	p, err := NewPublisher(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
	require.NoError(t, err)
	return runPublisher(t, p)
}

func pubConfig(layout Layout, hashes HashForm, replay bool) PublisherConfig {
	c := DefaultPublisherConfig()
	c.Endpoint = "tcp://127.0.0.1:0"
	if replay {
		c.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	c.Encoding = Encoding{Layout: layout, Hashes: hashes}
	c.DPRank = 0
	return c
}

// waitSubscribed waits until a subscription reached the publisher's PUB
// socket (messages before that are dropped by any PUB, vLLM's included).
func waitSubscribed(t *testing.T, p *Publisher) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, p.subscribed, "a subscriber on %s", p.Endpoint())
}

func publishScenario(p *Publisher, i int) { publishScenarioAt(p, i, float64(i)) }

func publishScenarioAt(p *Publisher, i int, ts float64) {
	b := Batch{TS: ts}
	for _, e := range scenarioEvents(i) {
		b.Events = append(b.Events, e.event())
	}
	p.Publish(b)
}
