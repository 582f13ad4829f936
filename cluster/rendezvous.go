package cluster

import "github.com/zeebo/xxh3"

// Class placement is rendezvous (highest random weight) hashing: every
// replica scores every class, and the class goes to the highest score among
// the candidates. Adding or removing a replica moves only the classes it wins
// or held, and every replica computes the same answer from the same set.
//
// The weight of replica r for class c is xxh3-64 of r's id, seeded with
// xxh3-64 of c's name (zeebo/xxh3 HashStringSeed / HashString). Equal weights,
// which need a 64-bit collision, go to the lexicographically smaller id.

// Score is the rendezvous weight of replica for class.
func Score(class, replica string) uint64 {
	return xxh3.HashStringSeed(replica, xxh3.HashString(class))
}

// Place returns the candidate that owns class, or "" when there is none.
func Place(class string, candidates []string) string {
	seed := xxh3.HashString(class)
	best, bestScore := "", uint64(0)
	for _, r := range candidates {
		s := xxh3.HashStringSeed(r, seed)
		if best == "" || s > bestScore || (s == bestScore && r < best) {
			best, bestScore = r, s
		}
	}
	return best
}
