package adapter

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/wire"
)

// Engine is the kind of engine an adapter fronts.
type Engine uint8

// The engines.
const (
	EngineVLLM Engine = iota + 1
	EngineSGLang
	EngineOpenAI
)

func (e Engine) String() string {
	switch e {
	case EngineVLLM:
		return "vllm"
	case EngineSGLang:
		return "sglang"
	case EngineOpenAI:
		return "openai"
	}
	return fmt.Sprintf("engine(%d)", uint8(e))
}

// ParseEngine reads an engine name (vllm, sglang, openai).
func ParseEngine(s string) (Engine, error) {
	for _, e := range []Engine{EngineVLLM, EngineSGLang, EngineOpenAI} {
		if strings.EqualFold(s, e.String()) {
			return e, nil
		}
	}
	return 0, fmt.Errorf("%w: engine %q is not vllm, sglang or openai", ErrInvalidConfig, s)
}

// Set and String make *Engine a flag.Value.
func (e *Engine) Set(s string) error {
	v, err := ParseEngine(s)
	if err != nil {
		return err
	}
	*e = v
	return nil
}

// maxAnswerBytes bounds what the adapter reads of one engine answer.
const maxAnswerBytes = 16 << 20

// engineClient speaks the engine's own HTTP API: health, discovery and
// metrics. It holds no state besides its configuration.
type engineClient struct {
	kind       Engine
	base       string // engine base URL without a trailing slash
	metricsURL string // "" when there is nothing to scrape
	http       *http.Client
	// tlsFailures counts requests that failed at TLS, by tlsFailure (nil:
	// not counted).
	tlsFailures *prometheus.CounterVec
}

func newEngineClient(kind Engine, base, metricsURL string, hc *http.Client) *engineClient {
	base = strings.TrimRight(base, "/")
	if metricsURL == "" && kind != EngineOpenAI {
		metricsURL = base + "/metrics"
	}
	return &engineClient{kind: kind, base: base, metricsURL: metricsURL, http: hc}
}

// get fetches url and returns its body, which must answer 200 and fit
// maxAnswerBytes.
func (c *engineClient) get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrDiscovery, url, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if f := classifyTLS(err); f != 0 {
			if c.tlsFailures != nil {
				c.tlsFailures.WithLabelValues(f.String()).Inc()
			}
			// err names the URL already.
			return nil, fmt.Errorf("%w (%s): %w", ErrEngineTLS, f.hint(), err)
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrDiscovery, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: read: %v", ErrDiscovery, url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: %s: status %d", ErrDiscovery, url, resp.StatusCode)
	}
	if len(body) > maxAnswerBytes {
		return nil, fmt.Errorf("%w: %s: answer beyond %d bytes", ErrMalformed, url, maxAnswerBytes)
	}
	return body, nil
}

// healthPath is what the engine's liveness is probed with: vLLM and SGLang
// have /health; a generic OpenAI server is alive when it lists its models.
func (c *engineClient) healthPath() string {
	if c.kind == EngineOpenAI {
		return "/v1/models"
	}
	return "/health"
}

// Health probes the engine once.
func (c *engineClient) Health(ctx context.Context) error {
	_, err := c.get(ctx, c.base+c.healthPath())
	return err
}

// Discovered is what the engine told about itself; zero fields are unknown.
type Discovered struct {
	Model            string
	Others           []string
	LoRAs            []string
	MaxModelLen      int
	Root             string           // the base model's root ("": not given)
	Cards            []wire.ModelCard // /v1/models as given
	BlockSize        int
	KVBlocks         int
	MaxNumSeqs       int
	MaxBatchedTokens int
	// Role and BootstrapPort are an SGLang engine's disaggregation_mode
	// and disaggregation_bootstrap_port ("" and 0: not disaggregated).
	Role          string
	BootstrapPort int
}

// Discover asks the engine what it serves and how its KV cache is shaped.
// Parts that fail are reported in the error; what succeeded is returned, so
// flags can fill the rest.
func (c *engineClient) Discover(ctx context.Context) (Discovered, error) {
	var d Discovered
	var errs []error
	body, err := c.get(ctx, c.base+"/v1/models")
	if err == nil {
		var ms Models
		if ms, err = ParseModels(body); err == nil {
			d.Model, d.Others, d.LoRAs, d.MaxModelLen = ms.Base, ms.Others, ms.LoRAs, ms.MaxModelLen
			d.Root, d.Cards = ms.Root, ms.Cards
		}
	}
	if err != nil {
		errs = append(errs, err)
	}
	switch c.kind {
	case EngineVLLM:
		body, err := c.get(ctx, c.metricsURL)
		if err == nil {
			var cc CacheConfig
			if cc, err = ParseCacheConfig(body); err == nil {
				d.BlockSize, d.KVBlocks = cc.BlockSize, cc.NumGPUBlocks
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	case EngineSGLang:
		body, err := c.get(ctx, c.base+"/get_server_info")
		if err != nil && errors.Is(err, ErrDiscovery) {
			// Renamed in some versions.
			body, err = c.get(ctx, c.base+"/server_info")
		}
		if err == nil {
			var si ServerInfo
			if si, err = ParseServerInfo(body); err == nil {
				d.BlockSize, d.KVBlocks = si.PageSize, si.KVBlocks()
				d.MaxNumSeqs, d.MaxBatchedTokens = si.MaxRunning, si.ChunkedPrefill
				d.Role, d.BootstrapPort = si.Role, si.BootstrapPort
				if d.MaxModelLen == 0 {
					d.MaxModelLen = si.ContextLength
				}
				if d.Model == "" {
					d.Model = si.ServedModelName
				}
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return d, errors.Join(errs...)
}

// Scrape fetches the engine's Prometheus text.
func (c *engineClient) Scrape(ctx context.Context) ([]byte, error) {
	if c.metricsURL == "" {
		return nil, fmt.Errorf("%w: no metrics URL", ErrInvalidConfig)
	}
	return c.get(ctx, c.metricsURL)
}

// tlsFailure is why a request to an https:// engine failed at TLS; the
// values label switchyard_adapter_engine_tls_failures_total.
type tlsFailure uint8

const (
	// tlsVerify: the engine's certificate does not verify (another CA, a
	// name it does not carry, expired).
	tlsVerify tlsFailure = iota + 1
	// tlsNotTLS: the engine answered in plaintext.
	tlsNotTLS
	// tlsRefused: the engine ended the handshake with an alert, most often
	// because it requires a client certificate the adapter did not send or
	// one from a CA it does not trust, or shares no TLS version with it.
	tlsRefused
)

var tlsFailures = []tlsFailure{tlsVerify, tlsNotTLS, tlsRefused}

func (f tlsFailure) String() string {
	switch f {
	case tlsVerify:
		return "verify"
	case tlsNotTLS:
		return "not_tls"
	case tlsRefused:
		return "refused"
	}
	return fmt.Sprintf("tls_failure(%d)", uint8(f))
}

// hint is what an operator checks first for f.
func (f tlsFailure) hint() string {
	switch f {
	case tlsVerify:
		return "the engine's certificate does not verify: check -engine-tls.ca-file and -engine-tls.server-name"
	case tlsNotTLS:
		return "the engine does not speak TLS: use an http:// URL or serve TLS on the engine"
	case tlsRefused:
		return "the engine refused the handshake: a client certificate missing or not trusted (-engine-tls.cert-file, -engine-tls.key-file), or no TLS version in common (-engine-tls.min-version)"
	}
	return f.String()
}

// classifyTLS says why err, from an HTTP request, failed at TLS, or 0 when
// it did not.
func classifyTLS(err error) tlsFailure {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		op       *net.OpError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &hostname), errors.As(err, &invalid):
		return tlsVerify
	// net/http replaces the RecordHeaderError of a plaintext answer with a
	// plain error whose text is all that is left of it.
	case errors.As(err, &record), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return tlsNotTLS
	// crypto/tls reports an alert received from the peer as a *net.OpError
	// with this Op (its alert type is not exported).
	case errors.As(err, &op) && op.Op == "remote error":
		return tlsRefused
	}
	return 0
}
