//go:build !race

package tokenizer

// corpusSize is the number of generated strings each differential test
// runs; see race_on_test.go.
const corpusSize = 100_000

const raceBuild = false
