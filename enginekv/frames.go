package enginekv

import (
	"encoding/binary"
	"fmt"
)

// EndSeq is the sequence number of the replay end marker: -1 as a signed
// 64-bit big-endian integer, all bits set.
const EndSeq = ^uint64(0)

// frameResult classifies a received multipart message; its String is the
// `result` label of the frames metric.
type frameResult uint8

const (
	frameOK frameResult = iota + 1
	frameBadCount
	frameBadSeq
	frameBadPayload
	frameDuplicate
	frameEnd // a replay end marker
)

func (r frameResult) String() string {
	switch r {
	case frameOK:
		return "ok"
	case frameBadCount:
		return "bad_frame_count"
	case frameBadSeq:
		return "bad_seq"
	case frameBadPayload:
		return "bad_payload"
	case frameDuplicate:
		return "duplicate"
	case frameEnd:
		return "end_marker"
	}
	return fmt.Sprintf("frameResult(%d)", uint8(r))
}

// rawBatch is a message split into its parts, payload not yet decoded.
type rawBatch struct {
	topic   string
	seq     uint64
	payload []byte
}

// parseLive splits a message of the PUB stream: [topic, seq, payload] as
// every vLLM and SGLang version read sends it. A two-frame [seq, payload]
// is tolerated (no version read sends it; a minimal publisher might).
func parseLive(frames [][]byte) (rawBatch, frameResult) {
	switch len(frames) {
	case 3:
		return parseSeqPayload(string(frames[0]), frames[1], frames[2])
	case 2:
		return parseSeqPayload("", frames[0], frames[1])
	}
	return rawBatch{}, frameBadCount
}

// parseReplay splits a reply from the replay ROUTER as a DEALER receives
// it: an empty delimiter, then [topic, seq, payload] (vLLM since replies
// carry the topic) or [seq, payload] (older vLLM, SGLang). The end marker
// has seq EndSeq and an empty payload.
func parseReplay(frames [][]byte) (rawBatch, frameResult) {
	if len(frames) > 0 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	var rb rawBatch
	var res frameResult
	switch len(frames) {
	case 3:
		rb, res = parseSeqPayload(string(frames[0]), frames[1], frames[2])
	case 2:
		rb, res = parseSeqPayload("", frames[0], frames[1])
	default:
		return rawBatch{}, frameBadCount
	}
	if res == frameOK && rb.seq == EndSeq {
		return rb, frameEnd
	}
	return rb, res
}

func parseSeqPayload(topic string, seq, payload []byte) (rawBatch, frameResult) {
	if len(seq) != 8 {
		return rawBatch{}, frameBadSeq
	}
	return rawBatch{topic: topic, seq: binary.BigEndian.Uint64(seq), payload: payload}, frameOK
}

func seqBytes(seq uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	return b[:]
}
