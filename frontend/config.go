package frontend

import (
	"errors"
	"flag"
	"fmt"
	"time"
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
	// before cutting them.
	ShutdownGrace time.Duration
	// DialTimeout bounds connecting to a worker; a failed dial is retried on
	// another worker.
	DialTimeout time.Duration
	// MaxIdleConnsPerWorker sizes the keep-alive pool per worker; it should be
	// near the expected concurrent streams per worker so connections are reused.
	MaxIdleConnsPerWorker int
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
		ShutdownGrace:         30 * time.Second,
		DialTimeout:           3 * time.Second,
		MaxIdleConnsPerWorker: 256,
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
}
