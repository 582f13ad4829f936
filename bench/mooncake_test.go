package bench

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func openMooncake(t *testing.T, path string, policy BadLinePolicy) *MooncakeReader {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	r, err := NewMooncakeReader(f, MooncakeOptions{Name: "trace.jsonl", OnBadLine: policy})
	require.NoError(t, err)
	return r
}

func TestMooncakeReaderTurnsKnownLinesIntoKnownRequests(t *testing.T) {
	reqs, err := ReadAll(openMooncake(t, "testdata/mooncake_small.jsonl", BadLineFail), 0)
	require.NoError(t, err)
	require.Len(t, reqs, 5, "the blank line is not a record")

	first := reqs[0]
	assert.Equal(t, 0, first.Index)
	assert.Equal(t, 1, first.Line)
	assert.Equal(t, time.Duration(0), first.Arrival)
	assert.Equal(t, 1100, first.InputLength)
	assert.Equal(t, 10, first.OutputLength)
	assert.Equal(t, []uint64{0, 1, 2}, first.HashIDs)
	assert.Equal(t, []Segment{
		{Seed: MooncakeBlockSeed(0), Len: 512},
		{Seed: MooncakeBlockSeed(1), Len: 512},
		{Seed: MooncakeBlockSeed(2), Len: 76},
	}, first.Segments)

	assert.Equal(t, 1500*time.Millisecond, reqs[2].Arrival)
	last := reqs[4]
	assert.Equal(t, 4, last.Index)
	assert.Equal(t, 6, last.Line, "line numbers count the blank line")
	assert.Equal(t, 3000500*time.Microsecond, last.Arrival, "fractional milliseconds are kept")
}

func TestMooncakeTokensAreTheBlockTokensOfTheirHashIDs(t *testing.T) {
	reqs, err := ReadAll(openMooncake(t, "testdata/mooncake_small.jsonl", BadLineFail), 0)
	require.NoError(t, err)
	v := DefaultVocab()
	a := reqs[0].Tokens(v) // ids 0,1,2 (1100 tokens)
	b := reqs[1].Tokens(v) // ids 0,1 (1024 tokens)
	c := reqs[2].Tokens(v) // ids 0,3 (600 tokens)
	require.Len(t, a, 1100)
	require.Len(t, b, 1024)
	require.Len(t, c, 600)

	assert.Equal(t, a[:1024], b, "equal hash ids 0,1 give equal token blocks")
	assert.Equal(t, a[:512], c[:512], "hash id 0 gives the same block everywhere")
	assert.NotEqual(t, a[512:600], c[512:600], "different ids give different blocks")

	// The partial last block is the start of the id's full block.
	full := (&TraceRequest{Segments: []Segment{{Seed: MooncakeBlockSeed(2), Len: 512}}}).Tokens(v)
	assert.Equal(t, full[:76], a[1024:])

	for i, tok := range a {
		require.GreaterOrEqual(t, tok, uint32(DefaultVocabFirst), "token %d", i)
		require.Less(t, tok, uint32(DefaultVocabLimit), "token %d", i)
	}
}

func TestTokensRespectACustomVocabulary(t *testing.T) {
	r := TraceRequest{Segments: []Segment{{Seed: 7, Len: 5000}}, InputLength: 5000}
	v := Vocab{First: 1000, Limit: 1010}
	seen := map[uint32]bool{}
	for _, tok := range r.Tokens(v) {
		require.GreaterOrEqual(t, tok, uint32(1000))
		require.Less(t, tok, uint32(1010))
		seen[tok] = true
	}
	assert.Len(t, seen, 10, "5000 draws cover a 10-id vocabulary")
	assert.ErrorIs(t, Vocab{First: 5, Limit: 5}.Validate(), ErrInvalidConfig)
}

func TestMooncakeBadLinesFailWithTheirLineNumber(t *testing.T) {
	r := openMooncake(t, "testdata/mooncake_bad.jsonl", BadLineFail)
	_, err := r.Next()
	require.NoError(t, err, "line 1 is good")
	_, err = r.Next()
	var le *LineError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 2, le.Line)
	assert.ErrorIs(t, err, ErrBadRecord)
	assert.Contains(t, err.Error(), "trace.jsonl:2:")
	assert.Contains(t, err.Error(), "hash_ids has 2 ids, want ceil(1100/512) = 3")
	_, again := r.Next()
	assert.Equal(t, err, again, "the reader stays failed")
}

func TestMooncakeSkipPolicyRecordsEveryBadLineAndKeepsTheGoodOnes(t *testing.T) {
	r := openMooncake(t, "testdata/mooncake_bad.jsonl", BadLineSkip)
	reqs, err := ReadAll(r, 0)
	require.NoError(t, err)
	lines := []int{}
	for _, q := range reqs {
		lines = append(lines, q.Line)
	}
	assert.Equal(t, []int{1, 3, 7}, lines)
	assert.Equal(t, []int{0, 1, 2}, []int{reqs[0].Index, reqs[1].Index, reqs[2].Index}, "indexes stay dense")

	kept, n := r.Skipped()
	require.Equal(t, 4, n)
	want := map[int]string{2: "hash_ids has 2 ids", 4: "missing output_length", 5: "not a JSON object", 6: "before the previous record"}
	for _, le := range kept {
		assert.Contains(t, le.Error(), want[le.Line], "line %d", le.Line)
	}
}

func TestDecodeMooncakeLineRejectsEachKindOfBadRecord(t *testing.T) {
	cases := map[string]string{
		`{"input_length": 1, "output_length": 1, "hash_ids": [1]}`:                   "missing timestamp",
		`{"timestamp": 0, "output_length": 1, "hash_ids": [1]}`:                      "missing input_length",
		`{"timestamp": 0, "input_length": 1, "output_length": 1}`:                    "missing hash_ids",
		`{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`:  "timestamp -1",
		`{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`:    "input_length 0",
		`{"timestamp": 0, "input_length": 1, "output_length": 0, "hash_ids": [1]}`:   "output_length 0",
		`{"timestamp": 0, "input_length": 1.5, "output_length": 1, "hash_ids": [1]}`: "not a JSON object",
		`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-1]}`:  "not a JSON object",
		`{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [1]}`: "want ceil(513/512) = 2",
		`[1, 2, 3]`: "not a JSON object",
		`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]} {}`: "not a JSON object",
	}
	for line, want := range cases {
		_, err := DecodeMooncakeLine([]byte(line), MooncakeBlockSize)
		require.Error(t, err, line)
		assert.ErrorIs(t, err, ErrBadRecord, line)
		assert.Contains(t, err.Error(), want, line)
	}
}

func TestMooncakeReaderReadsThePublicTrace(t *testing.T) {
	path := sharedTrace(t, "conversation_trace.jsonl")
	r := openMooncake(t, path, BadLineFail)
	var n, blocks int
	var last TraceRequest
	for {
		q, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		n++
		blocks += len(q.Segments)
		require.Equal(t, uint64(0), q.HashIDs[0], "README: every request starts with id 0")
		last = q
	}
	assert.Equal(t, 12031, n, "README record count")
	// README: 3,537 s long.
	assert.InDelta(t, 3537, last.Arrival.Seconds(), 5)
	assert.Positive(t, blocks)
}

func FuzzDecodeMooncakeLine(f *testing.F) {
	seeds := []string{
		`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}`,
		`{"timestamp": 1.5, "input_length": 1, "output_length": 1, "hash_ids": [9]}`,
		`{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [1]}`,
		`{"timestamp": 1e300, "input_length": 4194305, "output_length": 1, "hash_ids": []}`,
		`{}`, `null`, `[]`, `{"hash_ids": null}`, "",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		rec, err := DecodeMooncakeLine(line, MooncakeBlockSize)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("error %v does not wrap ErrBadRecord", err)
			}
			return
		}
		if rec.InputLength < 1 || rec.OutputLength < 1 || rec.TimestampMs < 0 {
			t.Fatalf("accepted invalid record %+v", rec)
		}
		if len(rec.HashIDs) != (rec.InputLength+MooncakeBlockSize-1)/MooncakeBlockSize {
			t.Fatalf("accepted %d ids for %d tokens", len(rec.HashIDs), rec.InputLength)
		}
		if strings.ContainsRune(string(line), '\n') {
			return // JSON may span lines; the reader is line-based
		}
		// A valid record always reads back as a request with exactly
		// input_length tokens.
		r, err := NewMooncakeReader(strings.NewReader(string(line)), MooncakeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		q, err := r.Next()
		if err != nil {
			t.Fatalf("reader rejects a line the decoder accepts: %v", err)
		}
		total := 0
		for _, s := range q.Segments {
			total += s.Len
		}
		if total != rec.InputLength {
			t.Fatalf("segments hold %d tokens, want %d", total, rec.InputLength)
		}
	})
}
