// Package tenant owns API keys and the tenants they name (design §15): the
// keys file (YAML) maps the SHA-256 of each key to a tenant with its allowed
// models, default class, the classes it may ask for by header, its weight
// and its quotas. Only hashes are stored; a presented key is hashed and the
// hash compared in constant time; no key is ever logged. The same file
// may hold admin keys (admins:), which open only the router's admin routes
// when those share the API's listener; no key is both a tenant's and an
// admin's.
//
// It owns:
//   - Set: one validated keys file, immutable, safe for concurrent lookups.
//   - Store: the Set in use behind an atomic pointer; Run (one goroutine,
//     returning when its context ends) reloads the file when it changes. An
//     invalid file is an error that keeps the last good Set.
//
// Enforcement is elsewhere: the frontend authenticates and checks models
// and classes (401/403); quotas and the sharing of a class between tenants
// are the class owner's scheduler (scheduler/tenants.go), so they hold
// cluster-wide. The package is a leaf: it imports nothing of ours.
package tenant
