package k8s

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// secretFiles are the files deploy/gencerts -k8s writes, which the
// kustomization's secretGenerator reads.
var secretFiles = []string{"ca.crt", "etcd.crt", "etcd.key", "nats.crt", "nats.key", "router.crt", "router.key",
	"worker.crt", "worker.key", "nats-router.password", "nats-worker.password", "gossip.keyring", "keys.yaml"}

// render runs kustomize (the library kubectl apply -k uses) on a copy of
// this directory with stand-in secret files and returns the objects of
// overlay ("." or "vllm").
func render(t *testing.T, overlay string) []object {
	t.Helper()
	dir := t.TempDir()
	for _, pattern := range []string{"*.yaml", "base/*.yaml", "vllm/*.yaml"} {
		files, err := filepath.Glob(pattern)
		require.NoError(t, err)
		for _, f := range files {
			raw, err := os.ReadFile(f)
			require.NoError(t, err)
			require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, f), raw, 0o600))
		}
	}
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "base", "secrets"), 0o700))
	for _, f := range secretFiles {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "base", "secrets", f), []byte("stand-in "+f+"\n"), 0o600))
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(dir, overlay))
	require.NoError(t, err)
	out, err := rm.AsYaml()
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(out))
	var objs []object
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return objs
		}
		require.NoError(t, err)
		o.file = "rendered " + overlay
		objs = append(objs, o)
	}
}

// checkSecretsExist asserts that every Secret a pod mounts or reads a
// variable from is in the rendered output.
func checkSecretsExist(t *testing.T, objs []object) {
	t.Helper()
	have := map[string]bool{}
	for _, o := range byKind(objs, "Secret") {
		have[o.Metadata.Name] = true
	}
	for _, o := range workloads(objs) {
		d := decodeSpec[deploymentSpec](t, o)
		for _, v := range d.Template.Spec.Volumes {
			if v.Secret != nil {
				assert.Truef(t, have[v.Secret.SecretName], "%s mounts Secret %s, which is not rendered", o.Metadata.Name, v.Secret.SecretName)
			}
		}
		for _, c := range d.Template.Spec.Containers {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					assert.Truef(t, have[e.ValueFrom.SecretKeyRef.Name], "%s reads Secret %s, which is not rendered", o.Metadata.Name, e.ValueFrom.SecretKeyRef.Name)
				}
			}
		}
	}
}

func TestTheRenderedKustomizationHasTLSAndCredentialsOnEveryLinkAndAPolicyForEveryComponent(t *testing.T) {
	for _, overlay := range []string{".", "vllm"} {
		t.Run(overlay, func(t *testing.T) {
			objs := render(t, overlay)
			require.NotEmpty(t, workloads(objs))
			checkLinks(t, objs)
			checkNetworkPolicies(t, objs)
			checkSecretsExist(t, objs)
			names := map[string]bool{}
			for _, o := range workloads(objs) {
				names[o.Metadata.Name] = true
			}
			assert.True(t, names["switchyard-etcd"] && names["switchyard-nats"] && names["switchyard-router"], "%v", names)
			if overlay == "vllm" {
				assert.False(t, names["switchyard-worker"], "the overlay replaces the simulated workers")
				assert.True(t, names["switchyard-vllm"])
			}
		})
	}
}
