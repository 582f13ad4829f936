//go:build race

package tokenizer

// corpusSize is the number of generated strings each differential test
// runs; the race detector slows the references tenfold, so fewer.
const corpusSize = 10_000

const raceBuild = true
