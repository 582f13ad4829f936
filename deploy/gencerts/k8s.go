package main

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/tenant"
)

// generateK8s writes the files deploy/k8s/base/kustomization.yaml's
// secretGenerator reads (deploy/k8s/base/secrets in the documented command): a CA, one
// certificate per role (etcd, nats, router, worker; the worker's also
// serves the adapters and vLLM, which routers verify by the name
// switchyard-worker), the NATS passwords of the router and worker users,
// the gossip keyring, and the routers' keys file with one tenant key
// (api.key) and one admin key (admin.key, for Prometheus or an operator).
//
// Files are 0600: they are read by kustomize on the operator's machine,
// and Kubernetes mounts them into the pods with its own modes.
func generateK8s(dir, namespace string, validity time.Duration) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := tlsconf.NewCA("switchyard k8s", validity)
	if err != nil {
		return err
	}
	for _, n := range []string{"etcd", "nats", "router", "worker"} {
		svc := "switchyard-" + n
		hosts := []string{svc, svc + "." + namespace, svc + "." + namespace + ".svc", svc + "." + namespace + ".svc.cluster.local", "localhost", "127.0.0.1"}
		if _, err := ca.WriteFiles(dir, n, hosts, tlsconf.Server, validity); err != nil {
			return err
		}
	}
	key, err := secret(32)
	if err != nil {
		return err
	}
	files := map[string]string{
		"gossip.keyring": "# primary first; docs/security.md rotates it\n" + base64.StdEncoding.EncodeToString(key) + "\n",
	}
	for _, user := range []string{"router", "worker"} {
		pw, err := natsPassword()
		if err != nil {
			return err
		}
		files["nats-"+user+".password"] = pw
	}
	apiKey, adminKey := newKey(), newKey()
	if apiKey == "" || adminKey == "" {
		return errors.New("random key: the system gave no randomness")
	}
	files["api.key"], files["admin.key"] = apiKey+"\n", adminKey+"\n"
	files["keys.yaml"] = "# API keys of the Kubernetes routers (-auth.keys-file); the keys are in api.key and admin.key\n" +
		"tenants:\n" +
		"  - id: default\n" +
		"    keys: [" + tenant.HashKey(apiKey) + "]\n" +
		"    classes: [interactive, batch, realtime]\n" +
		"admins:\n" +
		"  - id: operator\n" +
		"    keys: [" + tenant.HashKey(adminKey) + "]\n"
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// newKey is an API key as `switchyard keys generate` makes them ("" when
// the system has no randomness).
func newKey() string {
	b, err := secret(32)
	if err != nil {
		return ""
	}
	return "sy-" + base64.RawURLEncoding.EncodeToString(b)
}
