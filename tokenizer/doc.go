// Package tokenizer is Switchyard's deterministic default tokenizer, shared by
// the router (which hashes prompts into KV block hashes for routing) and the
// simulated engine (which caches the same blocks). Both sides must produce the
// same token ids for the same request, so the chat template lives here too.
//
// It is a stand-in for a model's tokenizer, not a model tokenizer: text is cut
// into pieces of at most four bytes (words, runs of spaces, punctuation), and
// each piece maps to an id in [FirstID, VocabSize) by FNV-1a. English text
// averages close to four characters per token, like BPE vocabularies. Ids
// below FirstID are reserved. Token-array prompts bypass it entirely.
//
// Everything here is a pure function and safe for concurrent use.
package tokenizer
