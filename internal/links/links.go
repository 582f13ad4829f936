package links

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/switchyard/switchyard/internal/tlsconf"
)

// ErrInvalidConfig wraps every Validate error.
var ErrInvalidConfig = errors.New("links: invalid config")

func bad(prefix, field, format string, args ...any) error {
	return fmt.Errorf("%w: %s%s: %s", ErrInvalidConfig, prefix, field, fmt.Sprintf(format, args...))
}

// Etcd is how a process authenticates to etcd and verifies it: TLS (with
// an https:// endpoint), mutual TLS (a client certificate), and/or etcd's
// own users (user name and password), as clientv3 supports them.
type Etcd struct {
	TLS tlsconf.ClientConfig
	// Username and Password authenticate with etcd's auth (etcdctl user
	// add, auth enable). PasswordFile, if set, holds the password instead.
	Username, Password, PasswordFile string
}

// RegisterFlags registers the flags under prefix (for example "etcd.").
func (e *Etcd) RegisterFlags(fs *flag.FlagSet, prefix string) {
	e.TLS.RegisterFlags(fs, prefix, "etcd")
	fs.StringVar(&e.Username, prefix+"username", e.Username, "etcd user name (etcd auth)")
	fs.StringVar(&e.Password, prefix+"password", e.Password, "etcd password (prefer -"+prefix+"password-file or the environment)")
	fs.StringVar(&e.PasswordFile, prefix+"password-file", e.PasswordFile, "file holding the etcd password")
}

// Validate names the first bad field under prefix.
func (e Etcd) Validate(prefix string) error {
	if err := e.TLS.Validate(prefix); err != nil {
		return err
	}
	switch {
	case e.Password != "" && e.PasswordFile != "":
		return bad(prefix, "password-file", "set together with password; give one")
	case e.Username == "" && (e.Password != "" || e.PasswordFile != ""):
		return bad(prefix, "username", "empty while a password is set")
	}
	return nil
}

// EtcdReconnect is how the etcd client reconnects after losing etcd. gRPC's
// default backoff (1 s growing ×1.6 to 120 s) leaves a client that lost etcd
// for 15 s disconnected for up to about 6 s after etcd is back, longer than a
// session's TTL/2 fence: a class owner would stay fenced while its peers have
// recovered and left degraded mode, and the class would be served by nobody
// (docs/operations.md, "etcd stopped"). Attempts every second at most cost
// etcd one refused dial per client per second while it is down. A dial that
// hangs (a peer address that no longer answers) is given up after
// MinConnectTimeout, so it cannot hold the next attempt back for gRPC's
// default 20 s either.
var EtcdReconnect = grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  100 * time.Millisecond,
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   time.Second,
	},
	MinConnectTimeout: 3 * time.Second,
}

// ClientConfig returns the clientv3 configuration for endpoints. TLS is used
// when an endpoint is https:// (then every endpoint must be) or any TLS
// setting is given.
func (e Etcd) ClientConfig(endpoints []string, log *zap.Logger, d tlsconf.Deps) (clientv3.Config, error) {
	if err := e.Validate("etcd."); err != nil {
		return clientv3.Config{}, err
	}
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: log,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(EtcdReconnect)}}
	secure, plain := 0, 0
	for _, ep := range endpoints {
		if u, err := url.Parse(ep); err == nil && (u.Scheme == "https" || u.Scheme == "unixs") {
			secure++
		} else {
			plain++
		}
	}
	if secure > 0 && plain > 0 {
		return clientv3.Config{}, fmt.Errorf("%w: etcd-endpoints: mixes https and plaintext endpoints", ErrInvalidConfig)
	}
	if e.TLS.Enabled() && plain > 0 {
		return clientv3.Config{}, fmt.Errorf("%w: etcd-endpoints: TLS settings given but the endpoints are not https://", ErrInvalidConfig)
	}
	if secure > 0 {
		if d.Name == "" {
			d.Name = "etcd"
		}
		t, err := e.TLS.Build(d)
		if err != nil {
			return clientv3.Config{}, fmt.Errorf("etcd TLS: %w", err)
		}
		cfg.TLS = t
	}
	if e.Username != "" {
		pw, err := secret(e.Password, e.PasswordFile)
		if err != nil {
			return clientv3.Config{}, fmt.Errorf("etcd password: %w", err)
		}
		cfg.Username, cfg.Password = e.Username, pw
	}
	return cfg, nil
}

// NATS is how a process authenticates to NATS and verifies it: TLS (a
// tls:// URL or any TLS setting), mutual TLS, and one of the server's
// credential kinds: user and password, token, NKey seed, or creds file
// (JWT and seed).
type NATS struct {
	TLS                          tlsconf.ClientConfig
	User, Password, PasswordFile string
	Token, TokenFile             string
	NKeyFile, CredsFile          string
}

// RegisterFlags registers the flags under prefix (for example "nats.").
func (n *NATS) RegisterFlags(fs *flag.FlagSet, prefix string) {
	n.TLS.RegisterFlags(fs, prefix, "NATS")
	fs.StringVar(&n.User, prefix+"user", n.User, "NATS user name")
	fs.StringVar(&n.Password, prefix+"password", n.Password, "NATS password (prefer -"+prefix+"password-file or the environment)")
	fs.StringVar(&n.PasswordFile, prefix+"password-file", n.PasswordFile, "file holding the NATS password")
	fs.StringVar(&n.Token, prefix+"token", n.Token, "NATS token (prefer -"+prefix+"token-file or the environment)")
	fs.StringVar(&n.TokenFile, prefix+"token-file", n.TokenFile, "file holding the NATS token")
	fs.StringVar(&n.NKeyFile, prefix+"nkey-file", n.NKeyFile, "file holding the NATS NKey seed (SU...)")
	fs.StringVar(&n.CredsFile, prefix+"creds-file", n.CredsFile, "NATS creds file (user JWT and NKey seed)")
}

// Validate names the first bad field under prefix.
func (n NATS) Validate(prefix string) error {
	if err := n.TLS.Validate(prefix); err != nil {
		return err
	}
	kinds := 0
	for _, set := range []bool{n.User != "", n.Token != "" || n.TokenFile != "", n.NKeyFile != "", n.CredsFile != ""} {
		if set {
			kinds++
		}
	}
	switch {
	case kinds > 1:
		return bad(prefix, "user", "give one credential kind: user, token, nkey-file or creds-file")
	case n.Password != "" && n.PasswordFile != "":
		return bad(prefix, "password-file", "set together with password; give one")
	case n.User == "" && (n.Password != "" || n.PasswordFile != ""):
		return bad(prefix, "user", "empty while a password is set")
	case n.Token != "" && n.TokenFile != "":
		return bad(prefix, "token-file", "set together with token; give one")
	}
	return nil
}

// Options returns the nats.go options for the settings: TLS when the URL
// is tls:// or a TLS setting is given, and the credentials.
func (n NATS) Options(natsURL string, d tlsconf.Deps) ([]nats.Option, error) {
	if err := n.Validate("nats."); err != nil {
		return nil, err
	}
	var opts []nats.Option
	if n.TLS.Enabled() || strings.HasPrefix(natsURL, "tls://") {
		if d.Name == "" {
			d.Name = "nats"
		}
		t, err := n.TLS.Build(d)
		if err != nil {
			return nil, fmt.Errorf("NATS TLS: %w", err)
		}
		opts = append(opts, nats.Secure(t))
	}
	switch {
	case n.User != "":
		pw, err := secret(n.Password, n.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("NATS password: %w", err)
		}
		opts = append(opts, nats.UserInfo(n.User, pw))
	case n.Token != "" || n.TokenFile != "":
		tok, err := secret(n.Token, n.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("NATS token: %w", err)
		}
		opts = append(opts, nats.Token(tok))
	case n.NKeyFile != "":
		o, err := nats.NkeyOptionFromSeed(n.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("NATS nkey: %w", err)
		}
		opts = append(opts, o)
	case n.CredsFile != "":
		if _, err := os.Stat(n.CredsFile); err != nil {
			return nil, fmt.Errorf("NATS creds: %w", err)
		}
		opts = append(opts, nats.UserCredentials(n.CredsFile))
	}
	return opts, nil
}

// secret is value, or the contents of file without surrounding whitespace.
func secret(value, file string) (string, error) {
	if file == "" {
		return value, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", file)
	}
	return s, nil
}
