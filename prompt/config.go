package prompt

import (
	"errors"
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Config configures a Registry. DefaultConfig holds every default.
type Config struct {
	// Tokenizers maps served model names to tokenizer specs: a Hugging Face
	// model directory, a tokenizer.json file, or tiktoken:ENCODING (built
	// into the binary). They win over the policy file's and the workers'.
	Tokenizers map[string]string
	// EngineTimeout bounds one /tokenize call to an engine.
	EngineTimeout time.Duration
	// EngineCacheBytes bounds the cache of engine-tokenized prompts.
	EngineCacheBytes int64
	// EngineBackoff is how long a model's engine path is skipped after a
	// failed /tokenize, so requests do not each wait EngineTimeout for an
	// engine that does not answer it.
	EngineBackoff time.Duration
	// EngineAttempts is how many of a model's engines one prompt tries, in
	// turn, before it is approximated; an engine that failed is skipped
	// for EngineBackoff, so one dead or hung engine costs one timeout, not
	// its model's engine path.
	EngineAttempts int
	// PrefixCacheBytes bounds each model's incremental chat tokenization
	// cache (token ids of rendered conversation prefixes).
	PrefixCacheBytes int64
	// FetchTimeout bounds downloading one model's advertised files.
	FetchTimeout time.Duration
	// FetchMaxBytes bounds the memory of all fetched tokenizer files.
	FetchMaxBytes int64
	// RetryInterval is how long a failed load or fetch waits before the
	// next attempt.
	RetryInterval time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		EngineTimeout:    200 * time.Millisecond,
		EngineCacheBytes: 32 << 20,
		EngineBackoff:    5 * time.Second,
		EngineAttempts:   3,
		PrefixCacheBytes: 64 << 20,
		FetchTimeout:     30 * time.Second,
		FetchMaxBytes:    256 << 20,
		RetryInterval:    30 * time.Second,
	}
}

// Validate names every bad field.
func (c Config) Validate() error {
	var errs []error
	for name, spec := range c.Tokenizers {
		if name == "" || spec == "" {
			errs = append(errs, fmt.Errorf("prompt.Tokenizers: %q=%q: both the model name and the spec must be non-empty", name, spec))
		}
	}
	if c.EngineTimeout <= 0 {
		errs = append(errs, fmt.Errorf("prompt.EngineTimeout: %v, must be > 0", c.EngineTimeout))
	}
	if c.EngineCacheBytes < 0 {
		errs = append(errs, fmt.Errorf("prompt.EngineCacheBytes: %d, must be >= 0", c.EngineCacheBytes))
	}
	if c.EngineBackoff < 0 {
		errs = append(errs, fmt.Errorf("prompt.EngineBackoff: %v, must be >= 0", c.EngineBackoff))
	}
	if c.EngineAttempts < 1 {
		errs = append(errs, fmt.Errorf("prompt.EngineAttempts: %d, must be >= 1", c.EngineAttempts))
	}
	if c.PrefixCacheBytes < 0 {
		errs = append(errs, fmt.Errorf("prompt.PrefixCacheBytes: %d, must be >= 0", c.PrefixCacheBytes))
	}
	if c.FetchTimeout <= 0 {
		errs = append(errs, fmt.Errorf("prompt.FetchTimeout: %v, must be > 0", c.FetchTimeout))
	}
	if c.FetchMaxBytes <= 0 {
		errs = append(errs, fmt.Errorf("prompt.FetchMaxBytes: %d, must be > 0", c.FetchMaxBytes))
	}
	if c.RetryInterval <= 0 {
		errs = append(errs, fmt.Errorf("prompt.RetryInterval: %v, must be > 0", c.RetryInterval))
	}
	return errors.Join(errs...)
}

// RegisterFlags binds c to fs: -tokenizer NAME=SPEC (repeatable; also
// comma-separated, for the SWITCHYARD_TOKENIZER variable) and the tuning
// flags under prefix (e.g. "tokenizer." gives -tokenizer.engine-timeout).
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.Var(tokenizerFlag{c}, "tokenizer", "model tokenizer as NAME=SPEC, SPEC a Hugging Face model directory, a tokenizer.json or tiktoken:o200k_base|cl100k_base (repeatable)")
	fs.DurationVar(&c.EngineTimeout, prefix+"engine-timeout", c.EngineTimeout, "timeout of asking an engine's /tokenize for a model with no tokenizer")
	fs.Int64Var(&c.EngineCacheBytes, prefix+"engine-cache-bytes", c.EngineCacheBytes, "memory for prompts tokenized by engines (LRU)")
	fs.DurationVar(&c.EngineBackoff, prefix+"engine-backoff", c.EngineBackoff, "after a failed /tokenize, skip that engine this long (and the model's engine path, when every attempt failed)")
	fs.IntVar(&c.EngineAttempts, prefix+"engine-attempts", c.EngineAttempts, "engines of a model one prompt tries in turn before it is approximated")
	fs.Int64Var(&c.PrefixCacheBytes, prefix+"prefix-cache-bytes", c.PrefixCacheBytes, "memory per model for token ids of rendered chat prefixes (incremental tokenization)")
	fs.DurationVar(&c.FetchTimeout, prefix+"fetch-timeout", c.FetchTimeout, "timeout of fetching a model's tokenizer files from its worker")
	fs.Int64Var(&c.FetchMaxBytes, prefix+"fetch-max-bytes", c.FetchMaxBytes, "memory for all fetched tokenizer files")
	fs.DurationVar(&c.RetryInterval, prefix+"retry-interval", c.RetryInterval, "wait before retrying a failed tokenizer load or fetch")
}

// tokenizerFlag is the repeatable -tokenizer NAME=SPEC.
type tokenizerFlag struct{ c *Config }

func (f tokenizerFlag) String() string {
	if f.c == nil || len(f.c.Tokenizers) == 0 {
		return ""
	}
	var out []string
	for n, s := range f.c.Tokenizers {
		out = append(out, n+"="+s)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func (f tokenizerFlag) Set(v string) error {
	m, err := ParseTokenizers(v)
	if err != nil {
		return err
	}
	// Copy on every write: the map may be shared with the defaults the
	// caller started from.
	cp := make(map[string]string, len(f.c.Tokenizers)+len(m))
	for k, s := range f.c.Tokenizers {
		cp[k] = s
	}
	f.c.Tokenizers = cp
	for n, s := range m {
		f.c.Tokenizers[n] = s
	}
	return nil
}

// ParseTokenizers parses "NAME=SPEC[,NAME=SPEC...]".
func ParseTokenizers(v string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, spec, ok := strings.Cut(item, "=")
		name, spec = strings.TrimSpace(name), strings.TrimSpace(spec)
		if !ok || name == "" || spec == "" {
			return nil, fmt.Errorf("%w: %q is not NAME=SPEC", ErrBadSpec, item)
		}
		out[name] = spec
	}
	return out, nil
}
