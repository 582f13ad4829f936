package k8s

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/switchyard/switchyard/adapter"
	"github.com/switchyard/switchyard/internal/links"
)

func loadVLLMManifests(t *testing.T) []object {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("vllm", "vllm-worker.yaml"))
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var out []object
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		if o.Kind != "" {
			o.file = "vllm/vllm-worker.yaml"
			out = append(out, o)
		}
	}
}

func TestTheVLLMOverlayListsItsManifestAndDeletesTheSimulatedWorkers(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("vllm", "kustomization.yaml"))
	require.NoError(t, err)
	var k struct {
		Kind      string   `yaml:"kind"`
		Resources []string `yaml:"resources"`
		Patches   []struct {
			Target struct{ Kind, Name string } `yaml:"target"`
			Patch  string                      `yaml:"patch"`
		} `yaml:"patches"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &k))
	assert.Equal(t, "Kustomization", k.Kind)
	assert.ElementsMatch(t, []string{"../base", "vllm-worker.yaml"}, k.Resources)
	deleted := map[string]bool{}
	for _, p := range k.Patches {
		if strings.Contains(p.Patch, "$patch: delete") {
			deleted[p.Target.Kind+"/"+p.Target.Name] = true
		}
	}
	assert.True(t, deleted["Deployment/switchyard-worker"] && deleted["Service/switchyard-worker"], "%v", deleted)
}

func TestTheVLLMPodsAdapterTalksToItsOwnEngineWithFlagsThatExist(t *testing.T) {
	objs := loadVLLMManifests(t)
	for _, o := range objs {
		want, ok := apiVersions[o.Kind]
		require.Truef(t, ok, "unexpected kind %s", o.Kind)
		assert.Equal(t, want, o.APIVersion)
	}
	deps := byKind(objs, "Deployment")
	require.Len(t, deps, 1)
	d := decodeSpec[deploymentSpec](t, deps[0])
	require.True(t, subset(d.Selector.MatchLabels, d.Template.Metadata.Labels))
	var vllm, ad *container
	for i, c := range d.Template.Spec.Containers {
		switch c.Name {
		case "vllm":
			vllm = &d.Template.Spec.Containers[i]
		case "adapter":
			ad = &d.Template.Spec.Containers[i]
		}
		if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet.Port.Value != "" {
			assert.Truef(t, portExists(c, c.ReadinessProbe.HTTPGet.Port, "TCP"), "%s readiness probe port", c.Name)
		}
	}
	require.NotNil(t, vllm)
	require.NotNil(t, ad)
	assert.Equal(t, []string{"adapter"}, ad.Args)

	// Every SWITCHYARD_* variable names a flag of `switchyard adapter`
	// (its own and the etcd and NATS links'; applyEnv's mapping).
	cfg := adapter.DefaultConfig()
	fs := flag.NewFlagSet("adapter", flag.ContinueOnError)
	cfg.RegisterFlags(fs, "")
	var etcd links.Etcd
	var nats links.NATS
	etcd.RegisterFlags(fs, "etcd.")
	nats.RegisterFlags(fs, "nats.")
	flagOf := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		flagOf["SWITCHYARD_"+strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(f.Name))] = f.Name
	})
	env := map[string]string{}
	for _, e := range ad.Env {
		if !strings.HasPrefix(e.Name, "SWITCHYARD_") {
			continue
		}
		flagName, ok := flagOf[e.Name]
		assert.Truef(t, ok, "%s names no adapter flag", e.Name)
		env[flagName] = e.Value
	}

	port := func(c *container, name string) int {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
		t.Fatalf("container %s has no port %s", c.Name, name)
		return 0
	}
	hostPort := func(raw string) (string, string) {
		u, err := url.Parse(raw)
		require.NoError(t, err, raw)
		return u.Hostname(), u.Port()
	}
	h, p := hostPort(env["engine-url"])
	assert.Equal(t, "127.0.0.1", h, "the adapter reaches vLLM inside the pod")
	assert.Equal(t, itoa(port(vllm, "http")), p)
	h, p = hostPort(env["engine-advertise-url"])
	assert.Equal(t, "$(POD_IP)", h, "routers get the pod IP")
	assert.Equal(t, itoa(port(vllm, "http")), p)
	_, p = hostPort("tcp://" + env["listen"])
	assert.Equal(t, itoa(port(ad, "adapter")), p)

	// vLLM's KV events config and the adapter's endpoints agree.
	var kv struct {
		Enable   bool   `json:"enable_kv_cache_events"`
		Endpoint string `json:"endpoint"`
		Replay   string `json:"replay_endpoint"`
		Topic    string `json:"topic"`
	}
	found := false
	for _, a := range vllm.Args {
		if v, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
			require.NoError(t, json.Unmarshal([]byte(v), &kv))
			found = true
		}
	}
	require.True(t, found, "vLLM is not told to publish KV events")
	assert.True(t, kv.Enable)
	_, pubPort := hostPort(kv.Endpoint)
	_, eventsPort := hostPort(env["kv-events"])
	assert.Equal(t, pubPort, eventsPort)
	_, replayPort := hostPort(kv.Replay)
	_, adReplay := hostPort(env["kv-replay"])
	assert.Equal(t, replayPort, adReplay)
	assert.Equal(t, kv.Topic, env["kv-topic"])
	assert.True(t, strings.HasPrefix(env["tokenizer-dir"], "/models/"), "the tokenizer comes from the mounted model")
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
