package frontend

import (
	"slices"

	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/scheduler"
)

// noteBlockSize adds a serving worker's block size to rt. Workers of one
// model may page their KV cache differently (SGLang at page size 1, vLLM at
// 16 or 32), and a worker's index entries are hashes at its own size, so a
// prompt is hashed once per distinct size: rt.blockSize becomes the
// smallest (the longest sequence, which bounds every worker's overlap), the
// others go to rt.otherSizes. sized says whether rt.blockSize already came
// from a worker rather than the configured default.
func (rt *routing) noteBlockSize(bs int, sized bool) bool {
	switch {
	case bs <= 0 || (sized && bs == rt.blockSize):
		return sized
	case !sized:
		rt.blockSize = bs
	case bs < rt.blockSize:
		rt.otherSizes = addSize(rt.otherSizes, rt.blockSize)
		rt.blockSize = bs
	default:
		rt.otherSizes = addSize(rt.otherSizes, bs)
	}
	return true
}

func addSize(sizes []int, bs int) []int {
	if slices.Contains(sizes, bs) {
		return sizes
	}
	return append(sizes, bs)
}

// sizedHashes is the prompt's sequence hashes at rt's other block sizes
// (nil when the model's workers share one).
func (rt *routing) sizedHashes(ids prompt.Result, seed uint64) []scheduler.BlockSequence {
	if len(rt.otherSizes) == 0 {
		return nil
	}
	out := make([]scheduler.BlockSequence, 0, len(rt.otherSizes))
	for _, bs := range rt.otherSizes {
		out = append(out, scheduler.BlockSequence{BlockSize: bs, Hashes: ids.SequenceHashes(bs, seed)})
	}
	return out
}

// overlaps asks the index for every worker's prefix depth at each of the
// request's block sizes; a worker matches only the hashes of its own size.
func (s *Server) overlaps(req *scheduler.Request) []scheduler.Overlap {
	out := s.deps.Index.Overlaps(nil, req.BlockHashes)
	for _, sq := range req.SizedHashes {
		if len(sq.Hashes) > 0 {
			out = s.deps.Index.Overlaps(out, sq.Hashes)
		}
	}
	return out
}
