// Package frontend is a router replica's OpenAI-compatible HTTP API
// (chat completions, completions, embeddings, responses): it parses and
// validates requests, classifies them into policy classes, has package
// prompt tokenize them with the model's tokenizer (the Prompts port),
// hashes them with the model's seed, looks up prefix overlaps, asks an Admitter
// for a worker, and proxies the response (SSE pass-through or a plain body)
// from the granted worker, marking the booking's lifecycle on the way.
//
// It owns the policy file schema (ParsePolicy), the mapping from scheduler
// rejections to OpenAI-shaped HTTP errors, and the request-path metrics. It
// imports the scheduler and kvindex cores and leaf packages only; everything
// cluster-shaped (worker registry, index, readiness, admission transport)
// reaches it through the small interfaces in ports.go.
//
// Concurrency: every request runs on its own net/http goroutine, and all the
// per-request work (parse, classify, tokenize, hash, lookup, proxy) happens on
// it; the frontend keeps no per-request state elsewhere. Server fields are
// read-only after New, except the in-flight stream counter (atomic) used by
// graceful shutdown. Server.Run owns the listener goroutine and returns only
// after the HTTP server has shut down and every handler has returned.
//
// Who completes a request: the handler that accepted it, exactly once. Every
// admitted request's Ticket is finished exactly once (Finish(aborted)) on
// every path: success, upstream failure, client disconnect, shutdown.
//
// A hung worker (hung.go): an attempt that could still move to another
// worker runs under a first-byte timeout derived from the grant's predicted
// TTFT; when it fires (a time.AfterFunc, which only cancels the attempt's
// context) the ticket is finished as aborted and the request re-admitted
// elsewhere. Consecutive timeouts per worker (atomic counters, shared by
// the request goroutines) report the worker to Deps.Suspects.
//
// With Deps.Tenants (auth.go) every /v1 request needs an API key: none or
// an unknown one is 401, a model or class the tenant may not use 403; the
// tenant rides the scheduler request to the class owner, whose quota
// rejection becomes 429 quota_exceeded, and the engine's usage is set on the
// ticket (UsageTicket) before Finish.
//
// The admin routes (/metrics, /debug/*, and any registered with
// HandleAdmin) are served by admin.go: on the admin listener when
// Config.AdminAddr is set, else on the API's behind an admin key
// (Deps.Admins) when keys are configured, else open. bounds.go bounds the
// API's requests per replica (in flight, buffered body bytes: 503
// overloaded) and listen.go the streams of one HTTP/2 connection.
package frontend
