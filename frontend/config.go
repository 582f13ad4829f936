package frontend

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/switchyard/switchyard/internal/listflag"
	"github.com/switchyard/switchyard/internal/tlsconf"
)

// Config is the frontend's configuration. DefaultConfig holds every default.
type Config struct {
	// Addr is the listen address of the OpenAI API.
	Addr string
	// MaxBodyBytes bounds a request body; larger bodies get 413.
	MaxBodyBytes int64
	// MaxPromptTokens bounds a prompt after tokenization; longer prompts get 400.
	MaxPromptTokens int
	// DefaultMaxTokens is the expected output length booked for requests that
	// do not set max_tokens.
	DefaultMaxTokens int
	// BlockSize is the KV block size used for hashing when no registered
	// worker reports one.
	BlockSize int
	// MaxAttempts bounds how many workers one request may be admitted to when
	// workers fail before sending their first byte.
	MaxAttempts int
	// RetryAfter is the Retry-After hint sent with 429 queue_full and 503.
	RetryAfter time.Duration
	// ShutdownGrace is how long graceful shutdown waits for in-flight streams
	// before cutting them. Its default (15 s) keeps a router's whole stop,
	// drain delay and hand-off included, inside Kubernetes' default 30 s
	// termination grace (internal/app ReplicaConfig.StopBound).
	ShutdownGrace time.Duration
	// DialTimeout bounds connecting to a worker; a failed dial is retried on
	// another worker.
	DialTimeout time.Duration
	// MaxIdleConnsPerWorker sizes the keep-alive pool per worker; it should be
	// near the expected concurrent streams per worker so connections are reused.
	MaxIdleConnsPerWorker int

	// Listener hardening (docs/security.md). ReadHeaderTimeout bounds
	// reading a request's headers, ReadTimeout the whole request with its
	// body, IdleTimeout a keep-alive connection's wait for its next request.
	// WriteTimeout bounds each write to the client (headers, a body chunk, a
	// stream event), not the response: a stream lives as long as the client
	// reads it, and a client that stops reading is cut after WriteTimeout
	// (to 9/8 of it: the deadline is moved once per eighth, see listen.go).
	// MaxHeaderBytes bounds request headers (431 above). MaxConns bounds
	// the API listener's open connections (0: unbounded); a client over it
	// waits to be accepted.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int
	MaxConns          int
	// MaxConcurrentStreams bounds the requests one HTTP/2 connection
	// carries at once (its SETTINGS; MaxConns counts connections).
	// MaxInflight bounds the API requests (POST) a replica serves at once
	// over all connections, streams included, and MaxBufferedBodyBytes the
	// body bytes they hold (a body of unknown length counts MaxBodyBytes);
	// over either: 503 with Retry-After (bounds.go). 0: unbounded.
	MaxConcurrentStreams int
	MaxInflight          int
	MaxBufferedBodyBytes int64
	// TLS serves the API over TLS from files reloaded on change.
	TLS tlsconf.ServerConfig
	// AdminAddr, if set, is a separate listener for /metrics,
	// /debug/cluster, /healthz and /readyz; the first two then leave the
	// API's listener. AdminTLS and AdminMaxConns are its TLS and bound.
	AdminAddr     string
	AdminTLS      tlsconf.ServerConfig
	AdminMaxConns int
	// EngineTLS verifies engines reached over https:// (a CA bundle) and
	// may present a client certificate to them.
	EngineTLS tlsconf.ClientConfig

	// First-byte timeout (docs/architecture.md, "engine hangs"). An attempt
	// that may still move to another worker is cancelled and retried there
	// when the worker sends nothing usable within FirstByteFactor × the
	// grant's predicted TTFT, clamped to [FirstByteFloor, FirstByteCap]
	// (FirstByteCap when the grant carries no prediction). "Nothing
	// usable" is no response headers for a non-streaming request and no
	// first data event for a stream. A non-streaming request's headers
	// come only with its whole answer, so it also gets FirstBytePerToken
	// for each output token it may generate, and only when it bounds them
	// (max_tokens); embeddings have none. 0 FirstByteCap turns it off.
	FirstByteFactor   float64
	FirstByteFloor    time.Duration
	FirstByteCap      time.Duration
	FirstBytePerToken time.Duration
	// SuspectAfter consecutive first-byte timeouts on one worker mark it
	// suspect for SuspectTTL on every replica (through gossip): no replica
	// selects it until the suspicion expires or a request to it succeeds.
	// 0 SuspectAfter never marks a worker.
	SuspectAfter int
	SuspectTTL   time.Duration

	// Session affinity (session.go, docs/api.md "Sessions"). SessionHeaders
	// name a request's session, the first one present winning (before
	// the body's prompt_cache_key and user); SessionTTL is how long a
	// session keeps its worker after its last turn; MaxSessions bounds the
	// replica's session table (least recently routed evicted first).
	SessionHeaders []string
	SessionTTL     time.Duration
	MaxSessions    int
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Addr:                  "127.0.0.1:8080",
		MaxBodyBytes:          4 << 20,
		MaxPromptTokens:       32768,
		DefaultMaxTokens:      256,
		BlockSize:             16,
		MaxAttempts:           3,
		RetryAfter:            time.Second,
		ShutdownGrace:         15 * time.Second,
		DialTimeout:           3 * time.Second,
		MaxIdleConnsPerWorker: 256,
		ReadHeaderTimeout:     10 * time.Second,
		ReadTimeout:           60 * time.Second,
		WriteTimeout:          60 * time.Second,
		IdleTimeout:           120 * time.Second,
		MaxHeaderBytes:        64 << 10,
		MaxConns:              4096,
		MaxConcurrentStreams:  100,
		MaxInflight:           4096,
		MaxBufferedBodyBytes:  256 << 20,
		AdminMaxConns:         64,
		FirstByteFactor:       4,
		FirstByteFloor:        2 * time.Second,
		FirstByteCap:          10 * time.Second,
		FirstBytePerToken:     100 * time.Millisecond,
		SuspectAfter:          2,
		SuspectTTL:            10 * time.Second,
		SessionHeaders:        []string{"x-session-id"},
		SessionTTL:            10 * time.Minute,
		MaxSessions:           100_000,
	}
}

// Validate names every bad field.
func (c Config) Validate() error {
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("frontend.Addr: empty"))
	}
	if c.MaxBodyBytes <= 0 {
		errs = append(errs, fmt.Errorf("frontend.MaxBodyBytes: %d, must be > 0", c.MaxBodyBytes))
	}
	if c.MaxPromptTokens <= 0 {
		errs = append(errs, fmt.Errorf("frontend.MaxPromptTokens: %d, must be > 0", c.MaxPromptTokens))
	}
	if c.DefaultMaxTokens <= 0 {
		errs = append(errs, fmt.Errorf("frontend.DefaultMaxTokens: %d, must be > 0", c.DefaultMaxTokens))
	}
	if c.BlockSize <= 0 {
		errs = append(errs, fmt.Errorf("frontend.BlockSize: %d, must be > 0", c.BlockSize))
	}
	if c.MaxAttempts <= 0 {
		errs = append(errs, fmt.Errorf("frontend.MaxAttempts: %d, must be > 0", c.MaxAttempts))
	}
	if c.RetryAfter < time.Second {
		errs = append(errs, fmt.Errorf("frontend.RetryAfter: %v, must be >= 1s (the header has second resolution)", c.RetryAfter))
	}
	if c.ShutdownGrace < 0 {
		errs = append(errs, fmt.Errorf("frontend.ShutdownGrace: %v, must be >= 0", c.ShutdownGrace))
	}
	if c.DialTimeout <= 0 {
		errs = append(errs, fmt.Errorf("frontend.DialTimeout: %v, must be > 0", c.DialTimeout))
	}
	if c.MaxIdleConnsPerWorker <= 0 {
		errs = append(errs, fmt.Errorf("frontend.MaxIdleConnsPerWorker: %d, must be > 0", c.MaxIdleConnsPerWorker))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ReadHeaderTimeout", c.ReadHeaderTimeout}, {"ReadTimeout", c.ReadTimeout}, {"WriteTimeout", c.WriteTimeout}, {"IdleTimeout", c.IdleTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("frontend.%s: %v, must be >= 0 (0: none)", d.name, d.v))
		}
	}
	if c.MaxHeaderBytes <= 0 {
		errs = append(errs, fmt.Errorf("frontend.MaxHeaderBytes: %d, must be > 0", c.MaxHeaderBytes))
	}
	if c.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("frontend.MaxConns: %d, must be >= 0 (0: unbounded)", c.MaxConns))
	}
	if c.MaxConcurrentStreams <= 0 {
		errs = append(errs, fmt.Errorf("frontend.MaxConcurrentStreams: %d, must be > 0", c.MaxConcurrentStreams))
	}
	if c.MaxInflight < 0 {
		errs = append(errs, fmt.Errorf("frontend.MaxInflight: %d, must be >= 0 (0: unbounded)", c.MaxInflight))
	}
	if c.MaxBufferedBodyBytes < 0 || (c.MaxBufferedBodyBytes > 0 && c.MaxBufferedBodyBytes < c.MaxBodyBytes) {
		errs = append(errs, fmt.Errorf("frontend.MaxBufferedBodyBytes: %d, must be 0 (unbounded) or >= MaxBodyBytes (%d)", c.MaxBufferedBodyBytes, c.MaxBodyBytes))
	}
	if c.AdminMaxConns < 0 {
		errs = append(errs, fmt.Errorf("frontend.AdminMaxConns: %d, must be >= 0 (0: unbounded)", c.AdminMaxConns))
	}
	if !(c.FirstByteFactor >= 1) {
		errs = append(errs, fmt.Errorf("frontend.FirstByteFactor: %v, must be >= 1", c.FirstByteFactor))
	}
	if c.FirstByteFloor <= 0 {
		errs = append(errs, fmt.Errorf("frontend.FirstByteFloor: %v, must be > 0", c.FirstByteFloor))
	}
	if c.FirstByteCap < 0 || (c.FirstByteCap > 0 && c.FirstByteCap < c.FirstByteFloor) {
		errs = append(errs, fmt.Errorf("frontend.FirstByteCap: %v, must be 0 (off) or >= FirstByteFloor (%v)", c.FirstByteCap, c.FirstByteFloor))
	}
	if c.FirstBytePerToken < 0 {
		errs = append(errs, fmt.Errorf("frontend.FirstBytePerToken: %v, must be >= 0", c.FirstBytePerToken))
	}
	if c.SuspectAfter < 0 {
		errs = append(errs, fmt.Errorf("frontend.SuspectAfter: %d, must be >= 0 (0: never)", c.SuspectAfter))
	}
	if c.SessionTTL <= 0 {
		errs = append(errs, fmt.Errorf("frontend.SessionTTL: %v, must be > 0", c.SessionTTL))
	}
	if c.MaxSessions <= 0 {
		errs = append(errs, fmt.Errorf("frontend.MaxSessions: %d, must be > 0", c.MaxSessions))
	}
	for _, h := range c.SessionHeaders {
		if h == "" || strings.ContainsAny(h, " \t:") {
			errs = append(errs, fmt.Errorf("frontend.SessionHeaders: %q is not a header name", h))
		}
	}
	if c.SuspectAfter > 0 && c.SuspectTTL <= 0 {
		errs = append(errs, fmt.Errorf("frontend.SuspectTTL: %v, must be > 0 with SuspectAfter", c.SuspectTTL))
	}
	if err := c.TLS.Validate("http.tls."); err != nil {
		errs = append(errs, err)
	}
	if c.AdminAddr == "" && (c.AdminTLS.Enabled() || c.AdminTLS.ClientCAFile != "") {
		errs = append(errs, errors.New("frontend.AdminTLS: set without http.admin-addr"))
	} else if err := c.AdminTLS.Validate("http.admin-tls."); err != nil {
		errs = append(errs, err)
	}
	if err := c.EngineTLS.Validate("http.engine-tls."); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// RegisterFlags binds c's fields to fs under prefix (e.g. "http." gives
// -http.addr).
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Addr, prefix+"addr", c.Addr, "listen address of the OpenAI API")
	fs.Int64Var(&c.MaxBodyBytes, prefix+"max-body-bytes", c.MaxBodyBytes, "largest accepted request body (413 above)")
	fs.IntVar(&c.MaxPromptTokens, prefix+"max-prompt-tokens", c.MaxPromptTokens, "longest accepted prompt in tokens (400 above)")
	fs.IntVar(&c.DefaultMaxTokens, prefix+"default-max-tokens", c.DefaultMaxTokens, "expected output tokens booked when max_tokens is absent")
	fs.IntVar(&c.BlockSize, prefix+"block-size", c.BlockSize, "KV block size for hashing when no worker reports one")
	fs.IntVar(&c.MaxAttempts, prefix+"max-attempts", c.MaxAttempts, "workers tried per request when workers fail before the first byte")
	fs.DurationVar(&c.RetryAfter, prefix+"retry-after", c.RetryAfter, "Retry-After sent with 429 queue_full and 503")
	fs.DurationVar(&c.ShutdownGrace, prefix+"shutdown-grace", c.ShutdownGrace, "how long shutdown waits for in-flight streams")
	fs.DurationVar(&c.DialTimeout, prefix+"dial-timeout", c.DialTimeout, "timeout for connecting to a worker")
	fs.IntVar(&c.MaxIdleConnsPerWorker, prefix+"max-idle-conns-per-worker", c.MaxIdleConnsPerWorker, "keep-alive connections kept per worker")
	fs.DurationVar(&c.ReadHeaderTimeout, prefix+"read-header-timeout", c.ReadHeaderTimeout, "time allowed to read a request's headers (0: none)")
	fs.DurationVar(&c.ReadTimeout, prefix+"read-timeout", c.ReadTimeout, "time allowed to read a whole request, body included (0: none)")
	fs.DurationVar(&c.WriteTimeout, prefix+"write-timeout", c.WriteTimeout, "time allowed for each write to a client; streams live as long as the client reads (0: none)")
	fs.DurationVar(&c.IdleTimeout, prefix+"idle-timeout", c.IdleTimeout, "how long a keep-alive connection waits for its next request (0: none)")
	fs.IntVar(&c.MaxHeaderBytes, prefix+"max-header-bytes", c.MaxHeaderBytes, "largest request header block (431 above)")
	fs.IntVar(&c.MaxConns, prefix+"max-conns", c.MaxConns, "open connections on the API listener at most (0: unbounded)")
	fs.IntVar(&c.MaxConcurrentStreams, prefix+"max-concurrent-streams", c.MaxConcurrentStreams, "requests one HTTP/2 connection may carry at once")
	fs.IntVar(&c.MaxInflight, prefix+"max-inflight", c.MaxInflight, "API requests served at once by the replica, streams included (503 above; 0: unbounded)")
	fs.Int64Var(&c.MaxBufferedBodyBytes, prefix+"max-buffered-body-bytes", c.MaxBufferedBodyBytes, "request body bytes held at once by the replica's API requests (503 above; 0: unbounded)")
	c.TLS.RegisterFlags(fs, prefix+"tls.", "the API listener")
	fs.StringVar(&c.AdminAddr, prefix+"admin-addr", c.AdminAddr, "separate listener for /metrics, /debug/cluster, /healthz and /readyz (empty: on the API listener, behind an admin key with a keys file)")
	c.AdminTLS.RegisterFlags(fs, prefix+"admin-tls.", "the admin listener")
	fs.IntVar(&c.AdminMaxConns, prefix+"admin-max-conns", c.AdminMaxConns, "open connections on the admin listener at most (0: unbounded)")
	c.EngineTLS.RegisterFlags(fs, prefix+"engine-tls.", "engines at https:// URLs")
	fs.Float64Var(&c.FirstByteFactor, prefix+"first-byte-factor", c.FirstByteFactor, "first-byte timeout: this many times the grant's predicted TTFT, within the floor and cap")
	fs.DurationVar(&c.FirstByteFloor, prefix+"first-byte-floor", c.FirstByteFloor, "shortest first-byte timeout")
	fs.DurationVar(&c.FirstByteCap, prefix+"first-byte-cap", c.FirstByteCap, "longest first-byte timeout, and the timeout without a prediction (0: no first-byte timeout)")
	fs.DurationVar(&c.FirstBytePerToken, prefix+"first-byte-per-token", c.FirstBytePerToken, "added to a non-streaming request's first-byte timeout per max_tokens (its headers come with the whole answer)")
	fs.IntVar(&c.SuspectAfter, prefix+"suspect-after", c.SuspectAfter, "consecutive first-byte timeouts that mark a worker suspect on every replica (0: never)")
	fs.DurationVar(&c.SuspectTTL, prefix+"suspect-ttl", c.SuspectTTL, "how long a suspect worker is skipped unless a request to it succeeds")
	fs.Func(prefix+"session-headers", fmt.Sprintf("comma-separated headers that name a request's session, first present wins (default %s; e.g. x-session-id,X-Dynamo-Session-ID,x-session-token,X-SMG-Routing-Key)", strings.Join(c.SessionHeaders, ",")), func(s string) error {
		c.SessionHeaders = listflag.Split(s)
		return nil
	})
	fs.DurationVar(&c.SessionTTL, prefix+"session-ttl", c.SessionTTL, "how long a session keeps its worker after its last turn")
	fs.IntVar(&c.MaxSessions, prefix+"max-sessions", c.MaxSessions, "sessions a replica remembers at most (least recently routed evicted first)")
}
