//go:build race

package tokenizer

// corpusSize is the number of generated strings each differential test
// runs; the race detector slows regexp2 and the reference BPE some
// thirtyfold, so the race build runs fewer (the non-race build runs 100,000).
const corpusSize = 2_000

const raceBuild = true
