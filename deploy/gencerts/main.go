// Command gencerts writes the throwaway secrets of the TLS docker-compose
// deployment (docker-compose.tls.yml) into one directory: a CA, one
// certificate per container (server and client use: etcd, nats, router-N,
// worker-N), a gossip keyring, secrets.env with a NATS password per
// user for the compose file's environment, and an API key (api.key) with
// the routers' keys file naming its hash (keys.yaml).
//
//	go run ./deploy/gencerts -dir deploy/certs
//
// With -k8s it writes the files of deploy/k8s's secretGenerator instead
// (k8s.go):
//
//	go run ./deploy/gencerts -k8s -dir deploy/k8s/base/secrets
//
// The files are world-readable (0644) because the containers run as
// another user than the one who runs this: for a local deployment only.
// Production secrets come from your PKI and secret store (docs/security.md).
//
// Concurrency: none; it writes files and exits.
package main

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/tenant"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gencerts", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "deploy/certs", "output directory")
	routers := fs.Int("routers", 3, "router certificates router-1..N")
	workers := fs.Int("workers", 8, "worker certificates and NATS users worker-1..N")
	validity := fs.Duration("validity", 30*24*time.Hour, "certificate validity")
	k8s := fs.Bool("k8s", false, "write the secret files of deploy/k8s/base instead (one certificate per role; -dir deploy/k8s/base/secrets)")
	namespace := fs.String("namespace", "default", "with -k8s: the namespace the certificates name the services in")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *k8s {
		if err := generateK8s(*dir, *namespace, *validity); err != nil {
			_, _ = fmt.Fprintf(stderr, "gencerts: %v\n", err)
			return 1
		}
		_, _ = fmt.Fprintf(stdout, "wrote the Kubernetes secret files to %s (kubectl apply -k deploy/k8s reads them)\n", *dir)
		return 0
	}
	if err := generate(*dir, *routers, *workers, *validity); err != nil {
		_, _ = fmt.Fprintf(stderr, "gencerts: %v\n", err)
		return 1
	}
	_, _ = fmt.Fprintf(stdout, "wrote CA, certificates, gossip.keyring and secrets.env to %s\n", *dir)
	return 0
}

func generate(dir string, routers, workers int, validity time.Duration) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ca, err := tlsconf.NewCA("switchyard compose", validity)
	if err != nil {
		return err
	}
	names := []string{"etcd", "nats"}
	for i := 1; i <= routers; i++ {
		names = append(names, fmt.Sprintf("router-%d", i))
	}
	for i := 1; i <= workers; i++ {
		names = append(names, fmt.Sprintf("worker-%d", i))
	}
	for _, n := range names {
		// Server certificates carry clientAuth too: each container uses its
		// one certificate both to serve and to dial etcd and NATS.
		f, err := ca.WriteFiles(dir, n, []string{n, "localhost", "127.0.0.1"}, tlsconf.Server, validity)
		if err != nil {
			return err
		}
		for _, p := range []string{f.CA, f.Cert, f.Key} {
			if err := os.Chmod(p, 0o644); err != nil {
				return err
			}
		}
	}
	key, err := secret(32)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "gossip.keyring"), []byte("# primary first; docs/security.md rotates it\n"+
		base64.StdEncoding.EncodeToString(key)+"\n"), 0o644); err != nil {
		return err
	}
	var env strings.Builder
	env.WriteString("# NATS passwords of docker-compose.tls.yml (deploy/nats/auth.conf reads the same names)\n")
	pw, err := natsPassword()
	if err != nil {
		return err
	}
	fmt.Fprintf(&env, "SWITCHYARD_NATS_ROUTER_PASSWORD=%s\n", pw)
	for i := 1; i <= workers; i++ {
		if pw, err = natsPassword(); err != nil {
			return err
		}
		fmt.Fprintf(&env, "SWITCHYARD_NATS_WORKER_%d_PASSWORD=%s\n", i, pw)
	}
	if err := os.WriteFile(filepath.Join(dir, "secrets.env"), []byte(env.String()), 0o644); err != nil {
		return err
	}
	return writeAPIKey(dir)
}

// writeAPIKey writes one API key (api.key) and the routers' keys file
// (keys.yaml) naming its hash: one tenant, "compose", that may use every
// model and ask for any of the default policy's classes, with no quotas.
func writeAPIKey(dir string) error {
	b, err := secret(32)
	if err != nil {
		return err
	}
	key := "sy-" + base64.RawURLEncoding.EncodeToString(b)
	if err := os.WriteFile(filepath.Join(dir, "api.key"), []byte(key+"\n"), 0o644); err != nil {
		return err
	}
	keys := "# API keys of docker-compose.tls.yml's routers (-auth.keys-file); the key is in api.key\n" +
		"tenants:\n" +
		"  - id: compose\n" +
		"    keys: [" + tenant.HashKey(key) + "]\n" +
		"    classes: [interactive, batch, realtime]\n"
	return os.WriteFile(filepath.Join(dir, "keys.yaml"), []byte(keys), 0o644)
}

// natsPassword is "sy" and 48 hex digits. nats-server parses an
// environment variable that a config file references as a config value: one
// starting with a digit or '-' is read as a number and fails the start
// ("Expected a digit"), which base64 passwords did at random.
func natsPassword() (string, error) {
	b, err := secret(24)
	if err != nil {
		return "", err
	}
	return "sy" + hex.EncodeToString(b), nil
}

func secret(n int) ([]byte, error) {
	b := make([]byte, n)
	_, err := rand.Read(b)
	return b, err
}
