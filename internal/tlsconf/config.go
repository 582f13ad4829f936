package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
)

// ErrInvalidConfig wraps every Validate error.
var ErrInvalidConfig = errors.New("tlsconf: invalid config")

// Client authentication modes of a server.
const (
	// ClientAuthNone asks for no client certificate.
	ClientAuthNone = "none"
	// ClientAuthVerifyIfGiven verifies a client certificate if one is sent.
	ClientAuthVerifyIfGiven = "verify-if-given"
	// ClientAuthRequire requires a client certificate signed by ClientCAFile.
	ClientAuthRequire = "require"
)

// DefaultCheckInterval is how often, at most, a built configuration looks
// at its files for changes.
const DefaultCheckInterval = time.Second

// ServerConfig is the TLS side of a listener. Empty CertFile and KeyFile
// mean plaintext.
type ServerConfig struct {
	// CertFile and KeyFile are PEM files: the certificate chain (leaf
	// first) and its private key. Both are re-read when they change.
	CertFile, KeyFile string
	// ClientCAFile is a PEM bundle of the CAs client certificates must
	// chain to; re-read when it changes. Required by ClientAuth "require".
	ClientCAFile string
	// ClientAuth is none, verify-if-given or require (default: require
	// when ClientCAFile is set, else none).
	ClientAuth string
	// MinVersion is "1.2" (default) or "1.3".
	MinVersion string
}

// Enabled reports whether the listener serves TLS.
func (c ServerConfig) Enabled() bool { return c.CertFile != "" || c.KeyFile != "" }

// Validate names the first bad field, under prefix (for example "http.tls.").
func (c ServerConfig) Validate(prefix string) error {
	bad := fieldError(prefix)
	// Without cert-file and key-file the pair check below passes, so this
	// comes first and the order of errors is the same as one switch.
	if !c.Enabled() && c.ClientCAFile != "" {
		return bad("client-ca-file", "set without cert-file and key-file")
	}
	if err := checkFiles(bad, c.CertFile, c.KeyFile, c.MinVersion); err != nil {
		return err
	}
	switch c.clientAuth() {
	case ClientAuthNone:
	case ClientAuthVerifyIfGiven, ClientAuthRequire:
		if c.ClientCAFile == "" {
			return bad("client-auth", "%q needs client-ca-file", c.ClientAuth)
		}
	default:
		return bad("client-auth", "%q; want none, verify-if-given or require", c.ClientAuth)
	}
	return nil
}

func (c ServerConfig) clientAuth() string {
	if c.ClientAuth != "" {
		return c.ClientAuth
	}
	if c.ClientCAFile != "" {
		return ClientAuthRequire
	}
	return ClientAuthNone
}

// RegisterFlags registers the config's flags under prefix (for example
// "http.tls."), with the receiver's current values as defaults. what names
// the listener in the help text.
func (c *ServerConfig) RegisterFlags(fs *flag.FlagSet, prefix, what string) {
	fs.StringVar(&c.CertFile, prefix+"cert-file", c.CertFile, "PEM certificate chain of "+what+" (with key-file: serve TLS; re-read when it changes)")
	fs.StringVar(&c.KeyFile, prefix+"key-file", c.KeyFile, "PEM private key of "+what+" (re-read when it changes)")
	fs.StringVar(&c.ClientCAFile, prefix+"client-ca-file", c.ClientCAFile, "PEM bundle of CAs that "+what+" accepts client certificates from (re-read when it changes)")
	fs.StringVar(&c.ClientAuth, prefix+"client-auth", c.ClientAuth, "client certificates on "+what+": none, verify-if-given or require (default: require with client-ca-file, else none)")
	fs.StringVar(&c.MinVersion, prefix+"min-version", c.MinVersion, "lowest TLS version "+what+" accepts: 1.2 or 1.3 (default 1.2)")
}

// Build loads the files and returns a server configuration that re-reads
// them when they change, or nil when TLS is not enabled. Serve it with
// tls.NewListener (Deps.NextProtos is the ALPN list: HTTPProtos for
// net/http's HTTP/2).
func (c ServerConfig) Build(d Deps) (*tls.Config, error) {
	if err := c.Validate(""); err != nil {
		return nil, err
	}
	if !c.Enabled() {
		return nil, nil
	}
	minV, _ := parseVersion(c.MinVersion)
	auth := map[string]tls.ClientAuthType{
		ClientAuthNone:          tls.NoClientCert,
		ClientAuthVerifyIfGiven: tls.VerifyClientCertIfGiven,
		ClientAuthRequire:       tls.RequireAndVerifyClientCert,
	}[c.clientAuth()]
	paths := []string{c.CertFile, c.KeyFile}
	if c.ClientCAFile != "" {
		paths = append(paths, c.ClientCAFile)
	}
	base := &tls.Config{MinVersion: minV, ClientAuth: auth, NextProtos: d.NextProtos}
	src, err := newSource(paths, d, func(b [][]byte) (*tls.Config, error) {
		cert, err := keyPair(b, c.CertFile, c.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg := base.Clone()
		cfg.Certificates = []tls.Certificate{cert}
		if len(b) > 2 {
			pool, err := parsePool(b[2])
			if err != nil {
				return nil, fmt.Errorf("client CA bundle %s: %w", c.ClientCAFile, err)
			}
			cfg.ClientCAs = pool
		}
		return cfg, nil
	})
	if err != nil {
		return nil, err
	}
	out := base.Clone()
	// The listener's config only delegates: each handshake takes the
	// newest certificate and client CAs.
	out.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return src.get(), nil }
	out.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return &src.get().Certificates[0], nil
	}
	return out, nil
}

// ClientConfig is the TLS side of a client. All empty means the system's
// roots verify the server and no client certificate is sent.
type ClientConfig struct {
	// CAFile is a PEM bundle of the CAs the server's certificate must chain
	// to (empty: the system's roots). Read once, at Build.
	CAFile string
	// CertFile and KeyFile are the client certificate and key, sent when
	// the server asks; re-read when they change.
	CertFile, KeyFile string
	// ServerName overrides the name verified in the server's certificate
	// (default: the host dialled).
	ServerName string
	// MinVersion is "1.2" (default) or "1.3".
	MinVersion string
}

// Enabled reports whether any TLS setting is given. A client dialling an
// https:// or tls:// URL uses TLS even without any.
func (c ClientConfig) Enabled() bool {
	return c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != ""
}

// Validate names the first bad field, under prefix (for example "etcd.").
func (c ClientConfig) Validate(prefix string) error {
	return checkFiles(fieldError(prefix), c.CertFile, c.KeyFile, c.MinVersion)
}

// RegisterFlags registers the config's flags under prefix (for example
// "etcd."), with the receiver's current values as defaults. what names the
// server in the help text.
func (c *ClientConfig) RegisterFlags(fs *flag.FlagSet, prefix, what string) {
	fs.StringVar(&c.CAFile, prefix+"ca-file", c.CAFile, "PEM bundle of CAs the certificate of "+what+" must chain to (default: the system's roots)")
	fs.StringVar(&c.CertFile, prefix+"cert-file", c.CertFile, "PEM client certificate presented to "+what+" (re-read when it changes)")
	fs.StringVar(&c.KeyFile, prefix+"key-file", c.KeyFile, "PEM private key of the client certificate for "+what+" (re-read when it changes)")
	fs.StringVar(&c.ServerName, prefix+"server-name", c.ServerName, "name expected in the certificate of "+what+" (default: the host dialled)")
	fs.StringVar(&c.MinVersion, prefix+"min-version", c.MinVersion, "lowest TLS version used with "+what+": 1.2 or 1.3 (default 1.2)")
}

// Build loads the files and returns a client configuration whose client
// certificate is re-read when it changes. It never returns nil: a client
// with no settings verifies against the system's roots.
func (c ClientConfig) Build(d Deps) (*tls.Config, error) {
	if err := c.Validate(""); err != nil {
		return nil, err
	}
	minV, _ := parseVersion(c.MinVersion)
	out := &tls.Config{MinVersion: minV, ServerName: c.ServerName}
	if c.CAFile != "" {
		b, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tlsconf: CA bundle: %w", err)
		}
		pool, err := parsePool(b)
		if err != nil {
			return nil, fmt.Errorf("tlsconf: CA bundle %s: %w", c.CAFile, err)
		}
		out.RootCAs = pool
	}
	if c.CertFile != "" {
		src, err := newSource([]string{c.CertFile, c.KeyFile}, d, func(b [][]byte) (*tls.Certificate, error) {
			cert, err := keyPair(b, c.CertFile, c.KeyFile)
			if err != nil {
				return nil, err
			}
			return &cert, nil
		})
		if err != nil {
			return nil, err
		}
		out.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return src.get(), nil
		}
	}
	return out, nil
}

// Deps are what a built configuration reports to and reads time from.
// Every field is optional.
type Deps struct {
	// Name labels the reload metrics and log lines (e.g. "http", "etcd").
	Name string
	// Logger receives reload failures; nil is a no-op logger.
	Logger *zap.Logger
	// Metrics counts reloads; nil counts nothing.
	Metrics *Metrics
	// Now is the clock of the reload check; nil is time.Now.
	Now func() time.Time
	// CheckInterval is how often, at most, the files are looked at
	// (default DefaultCheckInterval).
	CheckInterval time.Duration
	// NextProtos is a server's ALPN list.
	NextProtos []string
}

// HTTPProtos is the ALPN list of an HTTP server behind tls.NewListener:
// HTTP/2, then HTTP/1.1, as net/http serves them.
var HTTPProtos = []string{"h2", "http/1.1"}

// fieldError returns the Validate error for a field under prefix.
func fieldError(prefix string) func(field, format string, args ...any) error {
	return func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s%s: %s", ErrInvalidConfig, prefix, field, fmt.Sprintf(format, args...))
	}
}

// checkFiles checks what servers and clients share: cert-file and key-file
// come together, and min-version is known.
func checkFiles(bad func(field, format string, args ...any) error, certFile, keyFile, minVersion string) error {
	switch {
	case certFile == "" && keyFile != "":
		return bad("cert-file", "empty while key-file is set")
	case certFile != "" && keyFile == "":
		return bad("key-file", "empty while cert-file is set")
	}
	if _, err := parseVersion(minVersion); err != nil {
		return bad("min-version", "%v", err)
	}
	return nil
}

// keyPair parses b[0] and b[1], the contents of certFile and keyFile.
func keyPair(b [][]byte, certFile, keyFile string) (tls.Certificate, error) {
	cert, err := tls.X509KeyPair(b[0], b[1])
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("key pair %s, %s: %w", certFile, keyFile, err)
	}
	return cert, nil
}

func parseVersion(v string) (uint16, error) {
	switch v {
	case "", "1.2":
		return tls.VersionTLS12, nil
	case "1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("%q; want 1.2 or 1.3", v)
}

// parsePool reads a PEM bundle of at least one certificate.
func parsePool(b []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, errors.New("no PEM certificate in it")
	}
	return pool, nil
}
