package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/switchyard/switchyard/internal/app"
)

type composeService struct {
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
}

func readVLLMCompose(t *testing.T) map[string]composeService {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "docker-compose.vllm.yml"))
	require.NoError(t, err)
	var doc struct {
		Services map[string]composeService `yaml:"services"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	return doc.Services
}

func TestTheVLLMComposeFileSetsOnlyEnvironmentVariablesThatNameRealFlags(t *testing.T) {
	flags := map[string]map[string]bool{
		"router":  flagsOf(t, app.Router),
		"worker":  flagsOf(t, app.Worker),
		"adapter": flagsOf(t, app.Adapter),
	}
	checked := map[string]int{}
	for name, svc := range readVLLMCompose(t) {
		if len(svc.Command) == 0 || flags[svc.Command[0]] == nil {
			continue // etcd, nats
		}
		for k := range svc.Environment {
			if strings.HasPrefix(k, "SWITCHYARD_") {
				assert.Truef(t, flags[svc.Command[0]][k], "service %s sets %s, which no %s flag reads", name, k, svc.Command[0])
				checked[svc.Command[0]]++
			}
		}
	}
	for _, cmd := range []string{"router", "worker", "adapter"} {
		assert.Positivef(t, checked[cmd], "no SWITCHYARD_ variables found for %s services", cmd)
	}
}

func TestEveryVLLMEngineInTheComposeFileHasOneAdapterPointingAtItAndNoClusterSettings(t *testing.T) {
	svcs := readVLLMCompose(t)
	engines := 0
	for name, svc := range svcs {
		if len(svc.Command) == 0 || svc.Command[0] != "worker" {
			continue
		}
		engines++
		env := svc.Environment
		assert.Equalf(t, "vllm", env["SWITCHYARD_PROTOCOL"], "%s must speak vLLM's protocol", name)
		// The worker refuses etcd and NATS settings with -protocol vllm.
		assert.NotContainsf(t, env, "SWITCHYARD_ETCD_ENDPOINTS", "%s must not register itself", name)
		assert.NotContainsf(t, env, "SWITCHYARD_NATS_URL", "%s must not publish on NATS", name)
		assert.Equalf(t, "tcp://0.0.0.0:5557", env["SWITCHYARD_KV_EVENTS_BIND"], "%s must bind its PUB socket for the adapter", name)
		assert.Equalf(t, "tcp://0.0.0.0:5558", env["SWITCHYARD_KV_REPLAY_BIND"], "%s must serve replay", name)

		ad, ok := svcs["adapter-"+strings.TrimPrefix(name, "worker-")]
		if !assert.Truef(t, ok, "%s has no adapter service", name) {
			continue
		}
		require.NotEmpty(t, ad.Command)
		assert.Equal(t, "adapter", ad.Command[0])
		aenv := ad.Environment
		assert.Equalf(t, name, aenv["SWITCHYARD_ID"], "the adapter of %s must register it under its service name", name)
		assert.Equalf(t, "http://"+name+":9000", aenv["SWITCHYARD_ENGINE_URL"], "adapter of %s", name)
		assert.Equalf(t, "tcp://"+name+":5557", aenv["SWITCHYARD_KV_EVENTS"], "adapter of %s", name)
		assert.Equalf(t, "tcp://"+name+":5558", aenv["SWITCHYARD_KV_REPLAY"], "adapter of %s", name)
		assert.Equalf(t, "vllm", aenv["SWITCHYARD_ENGINE"], "adapter of %s", name)
		// The e2e suite scrapes engines on 1900N and adapters on 1910N.
		n := strings.TrimPrefix(name, "worker-")
		assert.Equalf(t, []string{"127.0.0.1:1900" + n + ":9000"}, svc.Ports, "%s's published port", name)
		assert.Equalf(t, []string{"127.0.0.1:1910" + n + ":9100"}, ad.Ports, "adapter of %s's published port", name)
	}
	assert.Equal(t, 4, engines, "the variant runs four engines")
}
