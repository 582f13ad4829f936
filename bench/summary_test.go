package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPercentilesInterpolateBetweenClosestRanks(t *testing.T) {
	v := make([]float64, 100)
	for i := range v {
		v[i] = float64(100 - i) // 100..1, StatsOf sorts
	}
	st := StatsOf(v)
	assert.Equal(t, 100, st.Count)
	assert.InDelta(t, 50.5, st.Mean, 1e-9)
	assert.InDelta(t, 50.5, st.P50, 1e-9)
	assert.InDelta(t, 90.1, st.P90, 1e-9)
	assert.InDelta(t, 99.01, st.P99, 1e-9)
	assert.Equal(t, 100.0, st.Max)

	assert.Equal(t, 7.0, Percentile([]float64{7}, 99), "one sample is every percentile")
	assert.Equal(t, 0.0, Percentile(nil, 50))
	assert.InDelta(t, 15, Percentile([]float64{10, 20}, 50), 1e-9)
	assert.Equal(t, 20.0, Percentile([]float64{10, 20}, 150), "p is clamped to 100")
	assert.Equal(t, Stats{}, StatsOf(nil))
}

// knownResults is a small run: 3 ok, 1 queue_full, 1 deadline_exceeded.
func knownResults() []Result {
	ok := func(i int, class string, ttft, e2e time.Duration, itl ...time.Duration) Result {
		return Result{Index: i, Class: class, Sent: time.Duration(i) * time.Second, TTFT: ttft, E2E: e2e, ITL: itl,
			Chunks: len(itl) + 1, PromptTokens: 1000, CachedTokens: 250 * i, CompletionTokens: 10, Outcome: OutcomeOK}
	}
	return []Result{
		ok(0, "chat", 100*time.Millisecond, time.Second, 10*time.Millisecond, 20*time.Millisecond),
		ok(1, "chat", 200*time.Millisecond, 2*time.Second, 30*time.Millisecond),
		ok(2, "batch", 300*time.Millisecond, 3*time.Second),
		{Index: 3, Class: "chat", Sent: 3 * time.Second, E2E: time.Millisecond, Outcome: OutcomeHTTPError, HTTPStatus: 429, ErrorCode: "queue_full"},
		{Index: 4, Class: "chat", Sent: 4 * time.Second, Deadline: time.Second, DeadlineMissed: true, E2E: time.Millisecond,
			Outcome: OutcomeHTTPError, HTTPStatus: 429, ErrorCode: "deadline_exceeded"},
	}
}

func TestSummaryOfKnownResults(t *testing.T) {
	s := Summarize("run-a", knownResults())
	assert.Equal(t, 5, s.Requests)
	assert.Equal(t, 3, s.OK)
	assert.Equal(t, 2, s.Failed)
	// First send at 0 s, last end at 2 s + 3 s = 5 s.
	assert.InDelta(t, 5.0, s.DurationS, 1e-9)
	assert.InDelta(t, 3.0/5, s.RequestRate, 1e-9)
	assert.InDelta(t, 30.0/5, s.OutputTokenRate, 1e-9)
	assert.InDelta(t, 200, s.TTFT.P50, 1e-9)
	assert.InDelta(t, 200, s.TTFT.Mean, 1e-9)
	assert.Equal(t, 3, s.ITL.Count, "ITL pools every gap")
	assert.InDelta(t, 20, s.ITL.P50, 1e-9)
	assert.InDelta(t, 3000, s.E2E.Max, 1e-9)
	assert.Equal(t, int64(3000), s.PromptTokens)
	assert.Equal(t, int64(750), s.CachedTokens)
	assert.InDelta(t, 0.25, s.HitRate, 1e-9)
	assert.Equal(t, 1, s.DeadlineRequests)
	assert.Equal(t, 1, s.DeadlineMisses)
	assert.Equal(t, map[string]int{"ok": 3, "http_429_queue_full": 1, "http_429_deadline_exceeded": 1}, s.Outcomes)

	require.Len(t, s.Classes, 2)
	batch, chat := s.Classes[0], s.Classes[1]
	assert.Equal(t, "batch", batch.Class)
	assert.Equal(t, 1, batch.OK)
	assert.Equal(t, "chat", chat.Class)
	assert.Equal(t, 4, chat.Requests)
	assert.Equal(t, 2, chat.OK)
	assert.Equal(t, 1, chat.DeadlineMisses)
	assert.Equal(t, map[string]int{"ok": 2, "http_429_queue_full": 1, "http_429_deadline_exceeded": 1}, chat.Outcomes)
	assert.InDelta(t, 150, chat.TTFT.P50, 1e-9)
}

func TestSummaryRendersAsMarkdownAndJSON(t *testing.T) {
	a, b := Summarize("kv-aware", knownResults()), Summarize("round|robin", knownResults()[:2])
	var md bytes.Buffer
	require.NoError(t, WriteMarkdown(&md, a, b))
	text := md.String()
	assert.Contains(t, text, "| kv-aware | 5 | 3 | 0.60 | 6.0 | 200.0 |")
	assert.Contains(t, text, `| round\|robin |`, "labels cannot break the table")
	assert.Contains(t, text, "| chat | 4 | 2 |")
	assert.Contains(t, text, "http_429_deadline_exceeded 1, http_429_queue_full 1, ok 2")
	header := strings.Split(text, "\n")[0]
	row := strings.Split(text, "\n")[2]
	assert.Equal(t, strings.Count(header, "|"), strings.Count(row, "|"), "rows have as many cells as the header")

	var js bytes.Buffer
	require.NoError(t, WriteJSON(&js, a))
	var back []Summary
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	require.Len(t, back, 1)
	assert.Equal(t, a, back[0])
}

func TestResultsRoundTripThroughJSONL(t *testing.T) {
	in := knownResults()
	in[0].Worker, in[0].Target, in[0].Scheduled, in[0].Session = "w1", "http://r1", 1500*time.Microsecond, "s9"
	var buf bytes.Buffer
	w := NewResultWriter(&buf)
	for _, r := range in {
		require.NoError(t, w.Write(r))
	}
	require.NoError(t, w.Flush())
	assert.Contains(t, buf.String(), `"outcome":"ok"`)
	assert.Contains(t, buf.String(), `"itl_ms":[10,20]`)
	out, err := ReadResults(&buf, "results.jsonl")
	require.NoError(t, err)
	assert.Equal(t, in, out)

	_, err = ReadResults(strings.NewReader("{\"outcome\":\"ok\"}\n{\"outcome\":\"meh\"}\n"), "r.jsonl")
	var le *LineError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 2, le.Line)
}

func TestOutcomesHaveNamesAndStartAtOne(t *testing.T) {
	assert.Equal(t, "Outcome(0)", Outcome(0).String(), "the zero value is not an outcome")
	for o := OutcomeOK; o <= OutcomeCancelled; o++ {
		back, err := ParseOutcome(o.String())
		require.NoError(t, err)
		assert.Equal(t, o, back)
	}
	assert.Equal(t, "fail", BadLineFail.String())
	assert.Equal(t, "skip", BadLineSkip.String())
}

func FuzzDecodeResultLine(f *testing.F) {
	var buf bytes.Buffer
	w := NewResultWriter(&buf)
	for _, r := range knownResults() {
		_ = w.Write(r)
	}
	_ = w.Flush()
	for _, line := range strings.Split(buf.String(), "\n") {
		f.Add([]byte(line))
	}
	f.Add([]byte(`{"outcome":"ok","ttft_ms":1e300}`))
	f.Add([]byte(`{"outcome":"ok","itl_ms":[-1]}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := DecodeResultLine(line)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("error %v does not wrap ErrBadRecord", err)
			}
			return
		}
		if r.Outcome < OutcomeOK || r.Outcome > OutcomeCancelled || r.TTFT < 0 || r.E2E < 0 {
			t.Fatalf("accepted invalid result %+v", r)
		}
		// What decodes re-encodes and decodes to the same result.
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeResultLine(b); err != nil {
			t.Fatalf("re-encoded result does not decode: %v", err)
		}
	})
}
