package bench

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// AzureOptions configure an AzureReader.
type AzureOptions struct {
	// Name labels errors (usually the file name).
	Name string
	// OnBadLine chooses between failing and skipping malformed lines.
	OnBadLine BadLinePolicy
	// PrefixGroups > 0 gives every request a synthetic shared prefix: the
	// Azure traces carry no prefix information, so without this every prompt
	// is unique. A request's group is a hash of its index and Seed.
	PrefixGroups int
	// PrefixTokens is the shared prefix length (cut to the request's context
	// length when shorter).
	PrefixTokens int
	// Seed varies the synthesized tokens and group assignment between runs.
	Seed uint64
}

// DefaultAzureOptions fails on bad lines and adds no shared prefixes.
func DefaultAzureOptions() AzureOptions { return AzureOptions{OnBadLine: BadLineFail} }

// Validate names the first bad field.
func (o AzureOptions) Validate() error {
	switch {
	case o.OnBadLine != BadLineFail && o.OnBadLine != BadLineSkip:
		return fmt.Errorf("%w: azure on_bad_line %v", ErrInvalidConfig, o.OnBadLine)
	case o.PrefixGroups < 0:
		return fmt.Errorf("%w: azure prefix_groups %d must not be negative", ErrInvalidConfig, o.PrefixGroups)
	case o.PrefixTokens < 0 || o.PrefixTokens > maxInputTokens:
		return fmt.Errorf("%w: azure prefix_tokens %d outside [0, %d]", ErrInvalidConfig, o.PrefixTokens, maxInputTokens)
	case o.PrefixGroups > 0 && o.PrefixTokens == 0:
		return fmt.Errorf("%w: azure prefix_tokens must be positive when prefix_groups is set", ErrInvalidConfig)
	}
	return nil
}

// AzureRecord is one decoded Azure LLM inference trace row.
type AzureRecord struct {
	Timestamp       time.Time
	ContextTokens   int
	GeneratedTokens int
}

// azureHeader is the published traces' header, in their column order.
var azureHeader = []string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}

// azureTimeLayouts are tried in order. The 2023 traces use the first (with
// a 7-digit fraction, which Go accepts after the seconds); the 2024 ones add
// a UTC offset. Timestamps without a zone are taken as UTC.
var azureTimeLayouts = []string{
	"2006-01-02 15:04:05",
	"2006-01-02 15:04:05Z07:00",
	time.RFC3339Nano,
}

// DecodeAzureLine decodes one data row in the published column order
// (TIMESTAMP,ContextTokens,GeneratedTokens). Errors wrap ErrBadRecord.
func DecodeAzureLine(line []byte) (AzureRecord, error) {
	return decodeAzureFields(line, [3]int{0, 1, 2})
}

// decodeAzureFields decodes a row whose timestamp, context and generated
// columns sit at cols[0..2]. The traces are plain CSV without quoting.
func decodeAzureFields(line []byte, cols [3]int) (AzureRecord, error) {
	fields := strings.Split(string(bytes.TrimRight(line, "\r")), ",")
	if len(fields) != len(azureHeader) {
		return AzureRecord{}, badRecord("%d fields, want %d (%s)", len(fields), len(azureHeader), strings.Join(azureHeader, ","))
	}
	ts, err := parseAzureTime(strings.TrimSpace(fields[cols[0]]))
	if err != nil {
		return AzureRecord{}, err
	}
	ctx, err := parseTokenCount("ContextTokens", fields[cols[1]], 1)
	if err != nil {
		return AzureRecord{}, err
	}
	gen, err := parseTokenCount("GeneratedTokens", fields[cols[2]], 1)
	if err != nil {
		return AzureRecord{}, err
	}
	return AzureRecord{Timestamp: ts, ContextTokens: ctx, GeneratedTokens: gen}, nil
}

func parseAzureTime(s string) (time.Time, error) {
	for _, layout := range azureTimeLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, badRecord("TIMESTAMP %q is not like 2023-11-16 18:15:46.6805900", truncate(s, 40))
}

func parseTokenCount(field, s string, min int) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, badRecord("%s %q is not an integer", field, truncate(s, 40))
	}
	if n < min || n > maxInputTokens {
		return 0, badRecord("%s %d outside [%d, %d]", field, n, min, maxInputTokens)
	}
	return n, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// AzureReader streams an Azure LLM inference CSV trace. Arrivals are offsets
// from the first row's wall-clock timestamp.
type AzureReader struct {
	opts    AzureOptions
	lines   *lineReader
	cols    [3]int
	header  bool
	first   time.Time
	last    time.Time
	index   int
	skipped skipLog
	err     error
}

// NewAzureReader reads r with opts (a zero OnBadLine means fail).
func NewAzureReader(r io.Reader, opts AzureOptions) (*AzureReader, error) {
	if opts.OnBadLine == 0 {
		opts.OnBadLine = BadLineFail
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return &AzureReader{opts: opts, lines: newLineReader(r, opts.Name)}, nil
}

// Next implements Source. The first non-blank line must be the header (the
// three columns in any order, names case-insensitive); a bad header always
// fails. Timestamps must not decrease.
func (a *AzureReader) Next() (TraceRequest, error) {
	if a.err != nil {
		return TraceRequest{}, a.err
	}
	if !a.header {
		if err := a.readHeader(); err != nil {
			a.err = err
			return TraceRequest{}, err
		}
		a.header = true
	}
	for {
		line, err := a.lines.next()
		if err != nil {
			a.err = err
			return TraceRequest{}, err
		}
		rec, err := decodeAzureFields(line, a.cols)
		if err == nil && a.index > 0 && rec.Timestamp.Before(a.last) {
			err = badRecord("TIMESTAMP %s before the previous row's %s", rec.Timestamp.Format(time.RFC3339Nano), a.last.Format(time.RFC3339Nano))
		}
		if err != nil {
			le := &LineError{File: a.opts.Name, Line: a.lines.line, Err: err}
			if a.opts.OnBadLine == BadLineSkip {
				a.skipped.add(le)
				continue
			}
			a.err = le
			return TraceRequest{}, le
		}
		if a.index == 0 {
			a.first = rec.Timestamp
		}
		a.last = rec.Timestamp
		req := a.request(rec)
		a.index++
		return req, nil
	}
}

// Skipped returns the first skipped lines' errors (at most 100) and the
// total number of skipped lines.
func (a *AzureReader) Skipped() ([]*LineError, int) { return a.skipped.kept, a.skipped.count }

func (a *AzureReader) readHeader() error {
	line, err := a.lines.next()
	if err == io.EOF {
		return &LineError{File: a.opts.Name, Line: 1, Err: badRecord("empty file, want header %s", strings.Join(azureHeader, ","))}
	}
	if err != nil {
		return err
	}
	names := strings.Split(strings.TrimPrefix(string(line), "\ufeff"), ",")
	found := [3]int{-1, -1, -1}
	if len(names) == len(azureHeader) {
		for i, n := range names {
			for j, want := range azureHeader {
				if strings.EqualFold(strings.TrimSpace(n), want) && found[j] < 0 {
					found[j] = i
				}
			}
		}
	}
	for _, f := range found {
		if f < 0 {
			return &LineError{File: a.opts.Name, Line: a.lines.line,
				Err: badRecord("header %q, want the columns %s", truncate(string(line), 80), strings.Join(azureHeader, ","))}
		}
	}
	a.cols = found
	return nil
}

func (a *AzureReader) request(rec AzureRecord) TraceRequest {
	idx := uint64(a.index)
	var segs []Segment
	rest := rec.ContextTokens
	if a.opts.PrefixGroups > 0 {
		// The extra part keeps the group draw apart from the prefix seeds.
		group := seedOf(domainAzurePrefix, a.opts.Seed, idx, 1) % uint64(a.opts.PrefixGroups)
		n := min(a.opts.PrefixTokens, rest)
		segs = append(segs, Segment{Seed: seedOf(domainAzurePrefix, a.opts.Seed, group), Len: n})
		rest -= n
	}
	if rest > 0 {
		segs = append(segs, Segment{Seed: seedOf(domainAzureUnique, a.opts.Seed, idx), Len: rest})
	}
	return TraceRequest{
		Index:        a.index,
		Line:         a.lines.line,
		Arrival:      rec.Timestamp.Sub(a.first),
		InputLength:  rec.ContextTokens,
		OutputLength: rec.GeneratedTokens,
		Segments:     segs,
	}
}
