package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ErrNoCACertificates is wrapped when a CA file holds no PEM certificate.
var ErrNoCACertificates = errors.New("no CA certificates")

// ClientTLS returns the TLS configuration that trusts the CA in caFile (the
// TLS variant's generated CA, E2E_CA_FILE), or nil for caFile "" (the
// plaintext variants, which need none).
func ClientTLS(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w in %s", ErrNoCACertificates, caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
