package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"time"
)

// MooncakeBlockSize is the block size of the public Mooncake traces' hash_ids.
const MooncakeBlockSize = 512

// MooncakeOptions configure a MooncakeReader.
type MooncakeOptions struct {
	// Name labels errors (usually the file name).
	Name string
	// BlockSize is the number of prompt tokens per hash id (512 in the
	// published traces).
	BlockSize int
	// OnBadLine chooses between failing and skipping malformed lines.
	OnBadLine BadLinePolicy
}

// DefaultMooncakeOptions returns the published traces' settings, failing on
// the first bad line.
func DefaultMooncakeOptions() MooncakeOptions {
	return MooncakeOptions{BlockSize: MooncakeBlockSize, OnBadLine: BadLineFail}
}

// Validate names the first bad field.
func (o MooncakeOptions) Validate() error {
	if o.BlockSize <= 0 {
		return fmt.Errorf("%w: mooncake block_size %d must be positive", ErrInvalidConfig, o.BlockSize)
	}
	if o.OnBadLine != BadLineFail && o.OnBadLine != BadLineSkip {
		return fmt.Errorf("%w: mooncake on_bad_line %v", ErrInvalidConfig, o.OnBadLine)
	}
	return nil
}

// MooncakeRecord is one decoded Mooncake line.
type MooncakeRecord struct {
	TimestampMs  float64
	InputLength  int
	OutputLength int
	HashIDs      []uint64
}

// mooncakeLine mirrors the JSON; pointers tell a missing field from a zero.
type mooncakeLine struct {
	Timestamp    *float64  `json:"timestamp"`
	InputLength  *int64    `json:"input_length"`
	OutputLength *int64    `json:"output_length"`
	HashIDs      *[]uint64 `json:"hash_ids"`
}

// maxTimestampMs keeps arrivals representable as time.Duration with room to
// spare (about 3 years).
const maxTimestampMs = 1e11

// DecodeMooncakeLine decodes and validates one JSONL record: all four fields
// present, timestamp finite and non-negative, input_length in [1, 2^22],
// output_length ≥ 1, and len(hash_ids) == ceil(input_length/blockSize).
// Unknown fields are ignored. Errors wrap ErrBadRecord.
func DecodeMooncakeLine(line []byte, blockSize int) (MooncakeRecord, error) {
	if blockSize <= 0 {
		return MooncakeRecord{}, fmt.Errorf("%w: block size %d", ErrInvalidConfig, blockSize)
	}
	var l mooncakeLine
	if err := json.Unmarshal(line, &l); err != nil {
		return MooncakeRecord{}, badRecord("not a JSON object with numeric fields: %v", err)
	}
	switch {
	case l.Timestamp == nil:
		return MooncakeRecord{}, badRecord("missing timestamp")
	case l.InputLength == nil:
		return MooncakeRecord{}, badRecord("missing input_length")
	case l.OutputLength == nil:
		return MooncakeRecord{}, badRecord("missing output_length")
	case l.HashIDs == nil:
		return MooncakeRecord{}, badRecord("missing hash_ids")
	}
	ts := *l.Timestamp
	if math.IsNaN(ts) || ts < 0 || ts > maxTimestampMs {
		return MooncakeRecord{}, badRecord("timestamp %v outside [0, %g] ms", ts, float64(maxTimestampMs))
	}
	in, out := *l.InputLength, *l.OutputLength
	if in < 1 || in > maxInputTokens {
		return MooncakeRecord{}, badRecord("input_length %d outside [1, %d]", in, maxInputTokens)
	}
	if out < 1 || out > maxInputTokens {
		return MooncakeRecord{}, badRecord("output_length %d outside [1, %d]", out, maxInputTokens)
	}
	want := (in + int64(blockSize) - 1) / int64(blockSize)
	if int64(len(*l.HashIDs)) != want {
		return MooncakeRecord{}, badRecord("hash_ids has %d ids, want ceil(%d/%d) = %d", len(*l.HashIDs), in, blockSize, want)
	}
	return MooncakeRecord{TimestampMs: ts, InputLength: int(in), OutputLength: int(out), HashIDs: *l.HashIDs}, nil
}

// MooncakeReader streams a Mooncake JSONL trace. Each hash id becomes one
// block of BlockSize synthesized tokens derived from the id alone, so equal
// ids mean equal tokens in every request; the last block is cut to
// input_length.
type MooncakeReader struct {
	opts    MooncakeOptions
	lines   *lineReader
	index   int
	lastMs  float64
	skipped skipLog
	err     error
}

// NewMooncakeReader reads r with opts (zero fields take the defaults).
func NewMooncakeReader(r io.Reader, opts MooncakeOptions) (*MooncakeReader, error) {
	def := DefaultMooncakeOptions()
	if opts.BlockSize == 0 {
		opts.BlockSize = def.BlockSize
	}
	if opts.OnBadLine == 0 {
		opts.OnBadLine = def.OnBadLine
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	return &MooncakeReader{opts: opts, lines: newLineReader(r, opts.Name)}, nil
}

// Next implements Source. With BadLineFail the first bad line's *LineError
// ends the trace; with BadLineSkip bad lines are recorded (see Skipped).
// Timestamps must not decrease: open-loop replay relies on arrival order.
func (m *MooncakeReader) Next() (TraceRequest, error) {
	if m.err != nil {
		return TraceRequest{}, m.err
	}
	for {
		line, err := m.lines.next()
		if err != nil {
			m.err = err
			return TraceRequest{}, err
		}
		rec, err := DecodeMooncakeLine(line, m.opts.BlockSize)
		if err == nil && rec.TimestampMs < m.lastMs {
			err = badRecord("timestamp %v before the previous record's %v", rec.TimestampMs, m.lastMs)
		}
		if err != nil {
			le := &LineError{File: m.opts.Name, Line: m.lines.line, Err: err}
			if m.opts.OnBadLine == BadLineSkip {
				m.skipped.add(le)
				continue
			}
			m.err = le
			return TraceRequest{}, le
		}
		m.lastMs = rec.TimestampMs
		req := m.request(rec)
		m.index++
		return req, nil
	}
}

// Skipped returns the first skipped lines' errors (at most 100) and the
// total number of skipped lines.
func (m *MooncakeReader) Skipped() ([]*LineError, int) { return m.skipped.kept, m.skipped.count }

func (m *MooncakeReader) request(rec MooncakeRecord) TraceRequest {
	bs := m.opts.BlockSize
	segs := make([]Segment, len(rec.HashIDs))
	for i, id := range rec.HashIDs {
		n := bs
		if i == len(rec.HashIDs)-1 {
			n = rec.InputLength - bs*i
		}
		segs[i] = Segment{Seed: MooncakeBlockSeed(id), Len: n}
	}
	return TraceRequest{
		Index:        m.index,
		Line:         m.lines.line,
		Arrival:      time.Duration(math.Round(rec.TimestampMs * float64(time.Millisecond))),
		InputLength:  rec.InputLength,
		OutputLength: rec.OutputLength,
		Segments:     segs,
		HashIDs:      rec.HashIDs,
	}
}

// MooncakeBlockSeed is the segment seed of a Mooncake hash id. Tokens depend
// on the id only (not on its position): the ids are chained prefix ids, so an
// id already implies its position and everything before it.
func MooncakeBlockSeed(id uint64) uint64 { return seedOf(domainMooncakeBlock, id) }
