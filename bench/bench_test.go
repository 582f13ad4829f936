package bench

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/switchyard/switchyard/internal/clock"
)

// mooncakeBenchInput returns the public Mooncake trace when it is checked out
// next to the module, else the small testdata trace.
func mooncakeBenchInput(b *testing.B) ([]byte, string) {
	b.Helper()
	name := "testdata/mooncake_small.jsonl"
	if dir, err := os.Getwd(); err == nil {
		for ; ; dir = filepath.Dir(dir) {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				p := filepath.Join(dir, "..", "shared", "traces", "conversation_trace.jsonl")
				if _, err := os.Stat(p); err == nil {
					name = p
				}
				break
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	data, err := os.ReadFile(name)
	if err != nil {
		b.Fatal(err)
	}
	return data, name
}

// BenchmarkReadMooncake decodes the whole trace per iteration (records and
// segments, not tokens) and reports records/s.
func BenchmarkReadMooncake(b *testing.B) {
	data, name := mooncakeBenchInput(b)
	b.Logf("trace %s (%d bytes)", filepath.Base(name), len(data))
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	records := 0
	for b.Loop() {
		r, err := NewMooncakeReader(bytes.NewReader(data), MooncakeOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for {
			_, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			records++
		}
	}
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkSynthesizeTokens measures prompt token synthesis (a Mooncake
// median-length prompt of 14 blocks) in tokens/s.
func BenchmarkSynthesizeTokens(b *testing.B) {
	req := TraceRequest{InputLength: 14 * 512}
	for i := range 14 {
		req.Segments = append(req.Segments, Segment{Seed: MooncakeBlockSeed(uint64(i)), Len: 512})
	}
	buf := make([]uint32, 0, req.InputLength)
	v := DefaultVocab()
	b.ReportAllocs()
	tokens := 0
	for b.Loop() {
		buf = req.AppendTokens(buf[:0], v)
		tokens += len(buf)
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkRequestBody measures rendering a completions body for the same
// prompt, which the dispatcher does before each send.
func BenchmarkRequestBody(b *testing.B) {
	r, err := NewRunner(DefaultRunnerConfig(), RunnerDeps{})
	if err != nil {
		b.Fatal(err)
	}
	req := TraceRequest{InputLength: 14 * 512, OutputLength: 343}
	for i := range 14 {
		req.Segments = append(req.Segments, Segment{Seed: MooncakeBlockSeed(uint64(i)), Len: 512})
	}
	b.ReportAllocs()
	var n int
	for b.Loop() {
		n = len(r.body(&req))
	}
	b.SetBytes(int64(n))
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "bodies/s")
}

// BenchmarkReadStream measures the runner's SSE parsing cost per content
// chunk (a completions stream of 256 chunks plus usage), which bounds how
// many concurrent streams one core of the load generator can follow.
func BenchmarkReadStream(b *testing.B) {
	var body bytes.Buffer
	for i := range 256 {
		body.WriteString(`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"switchyard-sim","choices":[{"index":0,"text":"t`)
		body.WriteString(string(rune('a' + i%26)))
		body.WriteString(` ","finish_reason":null}]}` + "\n\n")
	}
	body.WriteString(`data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":9000,"completion_tokens":256,"prompt_tokens_details":{"cached_tokens":4096}}}` + "\n\ndata: [DONE]\n\n")
	data := body.Bytes()
	clk := clock.Real{}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	chunks := 0
	for b.Loop() {
		var res Result
		if err := readStream(bytes.NewReader(data), clk.Now, clk.Now(), &res); err != nil || res.Chunks != 256 {
			b.Fatalf("chunks %d err %v", res.Chunks, err)
		}
		chunks += res.Chunks
	}
	b.ReportMetric(float64(chunks)/b.Elapsed().Seconds(), "chunks/s")
}
