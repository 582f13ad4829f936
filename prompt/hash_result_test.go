package prompt

// hashResult is how the frontend hashes a tokenized request (main's
// benchmark binary hashes res.Tokens with kvindex.SequenceHashes).
func hashResult(res Result, blockSize int, seed uint64) []uint64 {
	return res.SequenceHashes(blockSize, seed)
}
