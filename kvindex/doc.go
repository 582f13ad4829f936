// Package kvindex knows which worker holds which prompt prefix in its KV cache.
//
// It owns block hashing (the same on routers and engines), the prefix index
// built from every worker's KV events, and predicted entries recorded at
// routing time. See the package's other files for the concurrency rules of
// each type.
package kvindex
