package e2e

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/switchyard/switchyard/frontend"
	"github.com/switchyard/switchyard/internal/app"
)

// flagsOf lists the flags a subcommand registers, from its own -h output,
// as the SWITCHYARD_* variable names its environment fallback reads.
func flagsOf(t *testing.T, run func(context.Context, []string, io.Writer, io.Writer) error) map[string]bool {
	t.Helper()
	var out, usage bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"-h"}, &out, &usage))
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z0-9.-]+)`).FindAllStringSubmatch(usage.String(), -1) {
		names["SWITCHYARD_"+strings.NewReplacer("-", "_", ".", "_").Replace(strings.ToUpper(m[1]))] = true
	}
	require.NotEmpty(t, names, "no flags in the usage text")
	return names
}

type composeDoc struct {
	Services map[string]struct {
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
	} `yaml:"services"`
}

func readComposeDoc(t *testing.T, name string) composeDoc {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "deploy", name))
	require.NoError(t, err)
	var doc composeDoc
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	return doc
}

func TestTheComposeFileSetsOnlyEnvironmentVariablesThatNameRealFlags(t *testing.T) {
	flags := map[string]map[string]bool{
		"router": flagsOf(t, app.Router),
		"worker": flagsOf(t, app.Worker),
	}
	base := readComposeDoc(t, "docker-compose.yml")
	// The TLS override sets no commands: its services run the base file's
	// (and the PD file's services have the base file's names and commands).
	for _, file := range []string{"docker-compose.yml", "docker-compose.tls.yml", "docker-compose.pd.yml"} {
		checked := 0
		for name, svc := range readComposeDoc(t, file).Services {
			cmd := base.Services[name].Command
			if len(cmd) == 0 || flags[cmd[0]] == nil {
				continue // etcd, nats, observability
			}
			for k := range svc.Environment {
				if strings.HasPrefix(k, "SWITCHYARD_") {
					assert.Truef(t, flags[cmd[0]][k], "%s: service %s sets %s, which no %s flag reads", file, name, k, cmd[0])
					checked++
				}
			}
		}
		assert.Positivef(t, checked, "no SWITCHYARD_ variables found in %s", file)
	}
}

func TestTheKubernetesManifestsSetOnlyEnvironmentVariablesThatNameRealFlags(t *testing.T) {
	flags := map[string]map[string]bool{
		"router": flagsOf(t, app.Router),
		"worker": flagsOf(t, app.Worker),
	}
	files, err := filepath.Glob(filepath.Join("..", "deploy", "k8s", "base", "*.yaml"))
	require.NoError(t, err)
	checked := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for {
			var obj struct {
				Kind string `yaml:"kind"`
				Spec struct {
					Template struct {
						Spec struct {
							Containers []struct {
								Image string   `yaml:"image"`
								Args  []string `yaml:"args"`
								Env   []struct {
									Name string `yaml:"name"`
								} `yaml:"env"`
							} `yaml:"containers"`
						} `yaml:"spec"`
					} `yaml:"template"`
				} `yaml:"spec"`
			}
			if dec.Decode(&obj) != nil {
				break
			}
			for _, c := range obj.Spec.Template.Spec.Containers {
				if c.Image != "switchyard" {
					continue // etcd and NATS
				}
				require.NotEmpty(t, c.Args)
				known := flags[c.Args[0]]
				require.NotNilf(t, known, "%s: unknown subcommand %s", f, c.Args[0])
				for _, e := range c.Env {
					if strings.HasPrefix(e.Name, "SWITCHYARD_") {
						assert.Truef(t, known[e.Name], "%s sets %s, which no %s flag reads", f, e.Name, c.Args[0])
						checked++
					}
				}
			}
		}
	}
	assert.Positive(t, checked)
}

// Gossip is encrypted in every compose cluster: the base and vLLM files make
// each router require encryption and take its key from an environment
// variable compose refuses to run without; the TLS override swaps the key
// for the keyring file (a router takes one or the other).
func TestEveryComposeRouterRequiresAGossipKey(t *testing.T) {
	required := regexp.MustCompile(`^\$\{SWITCHYARD_GOSSIP_SECRET_KEY:\?[^}]+\}$`)
	docs := map[string]composeDoc{}
	for _, file := range []string{"docker-compose.yml", "docker-compose.vllm.yml", "docker-compose.tls.yml", "docker-compose.pd.yml"} {
		docs[file] = readComposeDoc(t, file)
	}
	for _, file := range []string{"docker-compose.yml", "docker-compose.vllm.yml", "docker-compose.pd.yml"} {
		routers := 0
		for name, svc := range docs[file].Services {
			if !strings.HasPrefix(name, "router") {
				continue
			}
			routers++
			env := svc.Environment
			assert.Equalf(t, "true", env["SWITCHYARD_GOSSIP_REQUIRE_ENCRYPTION"], "%s: %s must refuse to start without a key", file, name)
			assert.Regexpf(t, required, env["SWITCHYARD_GOSSIP_SECRET_KEY"], "%s: %s's key must be required from the environment", file, name)
		}
		assert.Equalf(t, 3, routers, "%s: routers found", file)
	}
	overridden := 0
	for name, svc := range docs["docker-compose.tls.yml"].Services {
		if !strings.HasPrefix(name, "router") || len(docs["docker-compose.yml"].Services[name].Command) == 0 {
			continue
		}
		overridden++
		env := svc.Environment
		assert.NotEmptyf(t, env["SWITCHYARD_GOSSIP_KEYRING_FILE"], "tls: %s uses the keyring", name)
		v, ok := env["SWITCHYARD_GOSSIP_SECRET_KEY"]
		assert.Truef(t, ok && v == "", "tls: %s must blank the base file's single key, got %q", name, v)
	}
	assert.Equal(t, 3, overridden, "tls override: routers found")
}

// The pd variant's policy parses and splits the load: interactive requests
// disaggregate whenever any prefill is uncached, batch ones stay on the
// worker of role both while it is up.
func TestThePDVariantsPolicyDisaggregatesInteractiveAndNotBatch(t *testing.T) {
	p, err := frontend.LoadPolicy(filepath.Join("..", "deploy", "policy.pd.yaml"))
	require.NoError(t, err)
	want := map[string]int{"interactive": 1, "batch": -1}
	for _, c := range p.Classes {
		if w, ok := want[c.Name]; ok {
			assert.Equal(t, w, c.DisaggMinTokens, "class %s", c.Name)
			delete(want, c.Name)
		}
	}
	assert.Empty(t, want, "classes missing from deploy/policy.pd.yaml")
}
