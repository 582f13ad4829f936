package tlsconf

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a throwaway certificate authority: `switchyard up --tls` makes one
// per run, and tests make their own. Its key never leaves memory.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// Usage says what an issued certificate is for.
type Usage int

const (
	// Server certificates authenticate listeners (and carry clientAuth too,
	// since etcd and NATS members are both).
	Server Usage = iota + 1
	// Client certificates authenticate clients only.
	Client
)

// NewCA makes a CA named name, valid for validity from now.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Switchyard throwaway CA"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: CA certificate: %w", err)
	}
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// CertPEM is the CA's certificate, the bundle its issued certificates chain to.
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.pem...) }

// Issue makes a certificate and key (PEM) for name: hosts are its DNS names
// and IP addresses; a client certificate's common name is name.
func (ca *CA) Issue(name string, hosts []string, u Usage, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if u != Server && u != Client {
		return nil, nil, errors.New("tlsconf: issue: unknown usage")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tlsconf: key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		NotBefore:   now.Add(-time.Minute),
		NotAfter:    now.Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if u == Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("tlsconf: certificate %s: %w", name, err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("tlsconf: key %s: %w", name, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), nil
}

// Files are the paths of one issued certificate, its key and the CA bundle.
type Files struct {
	CA, Cert, Key string
}

// WriteFiles issues a certificate as Issue does and writes it to
// dir/name.crt and dir/name.key (mode 0600), with the CA's certificate in
// dir/ca.crt.
func (ca *CA) WriteFiles(dir, name string, hosts []string, u Usage, validity time.Duration) (Files, error) {
	c, k, err := ca.Issue(name, hosts, u, validity)
	if err != nil {
		return Files{}, err
	}
	f := Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
	for _, w := range []struct {
		path string
		b    []byte
	}{{f.CA, ca.pem}, {f.Cert, c}, {f.Key, k}} {
		if err := os.WriteFile(w.path, w.b, 0o600); err != nil {
			return Files{}, fmt.Errorf("tlsconf: %w", err)
		}
	}
	return f, nil
}
