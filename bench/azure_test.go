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

func openAzure(t *testing.T, path string, opts AzureOptions) *AzureReader {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	opts.Name = "trace.csv"
	r, err := NewAzureReader(f, opts)
	require.NoError(t, err)
	return r
}

func TestAzureReaderTurnsWallClockTimestampsIntoOffsetsFromTheFirst(t *testing.T) {
	reqs, err := ReadAll(openAzure(t, "testdata/azure_small.csv", AzureOptions{}), 0)
	require.NoError(t, err)
	require.Len(t, reqs, 4)
	assert.Equal(t, []time.Duration{0, 2250 * time.Millisecond, 2250 * time.Millisecond, 60 * time.Second},
		[]time.Duration{reqs[0].Arrival, reqs[1].Arrival, reqs[2].Arrival, reqs[3].Arrival})
	assert.Equal(t, 300, reqs[0].InputLength)
	assert.Equal(t, 40, reqs[0].OutputLength)
	assert.Equal(t, []int{2, 3}, []int{reqs[0].Line, reqs[1].Line}, "the header is line 1")
	for _, q := range reqs {
		assert.Len(t, q.Tokens(DefaultVocab()), q.InputLength)
	}
	assert.NotEqual(t, reqs[1].Tokens(DefaultVocab())[:300], reqs[0].Tokens(DefaultVocab()),
		"without synthetic prefixes prompts share nothing")
}

func TestAzureSyntheticPrefixesAreSharedWithinAGroup(t *testing.T) {
	opts := AzureOptions{PrefixGroups: 1, PrefixTokens: 256, Seed: 9}
	reqs, err := ReadAll(openAzure(t, "testdata/azure_small.csv", opts), 0)
	require.NoError(t, err)
	v := DefaultVocab()
	a, b, c := reqs[0].Tokens(v), reqs[1].Tokens(v), reqs[2].Tokens(v)
	assert.Equal(t, a[:256], b[:256], "one group: every prompt starts with the same prefix")
	assert.Equal(t, a[:256], c[:256])
	assert.NotEqual(t, a[256:300], b[256:300], "the rest is unique")
	short := reqs[3].Tokens(v)
	assert.Equal(t, a[:2], short, "a prompt shorter than the prefix is a cut prefix")

	other, err := ReadAll(openAzure(t, "testdata/azure_small.csv", AzureOptions{PrefixGroups: 1, PrefixTokens: 256, Seed: 10}), 0)
	require.NoError(t, err)
	assert.NotEqual(t, a[:256], other[0].Tokens(v)[:256], "the seed changes the synthesized tokens")
}

func TestAzureBadLinesAreReportedWithLineNumbers(t *testing.T) {
	r := openAzure(t, "testdata/azure_bad.csv", AzureOptions{OnBadLine: BadLineSkip})
	reqs, err := ReadAll(r, 0)
	require.NoError(t, err)
	require.Len(t, reqs, 2)
	assert.Equal(t, []int{2, 8}, []int{reqs[0].Line, reqs[1].Line})
	kept, n := r.Skipped()
	require.Equal(t, 5, n)
	want := map[int]string{
		3: `ContextTokens "abc" is not an integer`,
		4: "2 fields, want 3",
		5: `TIMESTAMP "yesterday"`,
		6: "before the previous row",
		7: "ContextTokens 0 outside",
	}
	for _, le := range kept {
		assert.Contains(t, le.Error(), "trace.csv:")
		assert.Contains(t, le.Error(), want[le.Line], "line %d", le.Line)
	}

	strict := openAzure(t, "testdata/azure_bad.csv", AzureOptions{})
	_, err = strict.Next()
	require.NoError(t, err)
	_, err = strict.Next()
	var le *LineError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 3, le.Line)
}

func TestAzureHeaderIsRequiredButColumnOrderIsFree(t *testing.T) {
	_, err := ReadAll(mustAzure(t, "ts,a,b\n2024-01-02 03:04:05,1,1\n"), 0)
	var le *LineError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 1, le.Line)
	assert.Contains(t, err.Error(), "want the columns TIMESTAMP,ContextTokens,GeneratedTokens")

	_, err = ReadAll(mustAzure(t, ""), 0)
	assert.ErrorIs(t, err, ErrBadRecord, "an empty file has no header")

	reqs, err := ReadAll(mustAzure(t, "generatedtokens,TIMESTAMP,ContextTokens\r\n7,2024-05-10 00:00:00.009930+00:00,30\r\n"), 0)
	require.NoError(t, err)
	require.Len(t, reqs, 1)
	assert.Equal(t, 30, reqs[0].InputLength)
	assert.Equal(t, 7, reqs[0].OutputLength)
}

func mustAzure(t *testing.T, s string) *AzureReader {
	t.Helper()
	r, err := NewAzureReader(strings.NewReader(s), AzureOptions{})
	require.NoError(t, err)
	return r
}

func TestAzureReaderReadsThePublicTraces(t *testing.T) {
	for name, want := range map[string]int{"AzureLLMInferenceTrace_conv.csv": 19366, "AzureLLMInferenceTrace_code.csv": 8819} {
		path := sharedTrace(t, name)
		r := openAzure(t, path, AzureOptions{})
		n := 0
		for {
			_, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, name)
			n++
		}
		assert.Equal(t, want, n, name)
	}
}

func FuzzDecodeAzureLine(f *testing.F) {
	for _, s := range []string{
		"2023-11-16 18:15:46.6805900,374,44",
		"2024-05-10 00:00:00.009930+00:00,1,1",
		"2024-05-10T00:00:00Z,5,5",
		"2023-11-16 18:15:46,0,1", ",,", "a,b,c,d", "", "2023-11-16 18:15:46,-3,99999999999999999999",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		rec, err := DecodeAzureLine(line)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("error %v does not wrap ErrBadRecord", err)
			}
			return
		}
		if rec.ContextTokens < 1 || rec.GeneratedTokens < 1 || rec.Timestamp.Location() != time.UTC {
			t.Fatalf("accepted invalid record %+v from %q", rec, line)
		}
	})
}
