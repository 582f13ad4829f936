package k8s

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// networkPolicySpec is the part of a NetworkPolicy the checks read.
type networkPolicySpec struct {
	PodSelector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"podSelector"`
	PolicyTypes []string `yaml:"policyTypes"`
	Ingress     []struct {
		From []struct {
			PodSelector *struct {
				MatchLabels      map[string]string `yaml:"matchLabels"`
				MatchExpressions []struct {
					Key      string   `yaml:"key"`
					Operator string   `yaml:"operator"`
					Values   []string `yaml:"values"`
				} `yaml:"matchExpressions"`
			} `yaml:"podSelector"`
			NamespaceSelector *yamlAny `yaml:"namespaceSelector"`
			IPBlock           *yamlAny `yaml:"ipBlock"`
		} `yaml:"from"`
	} `yaml:"ingress"`
}

type yamlAny map[string]any

// tier is the label of the pods that may reach etcd and NATS.
var tier = []string{"switchyard-router", "switchyard-worker", "switchyard-vllm"}

// checkLinks asserts that every workload in objs reaches etcd over https://
// only and NATS over TLS, each with a client certificate, and NATS with a
// user and a password from a file; that the files are on Secret volumes;
// that every URL it registers or dials is https://; and that routers serve
// the API over TLS with API keys and their admin routes off the API port.
func checkLinks(t *testing.T, objs []object) {
	t.Helper()
	sawEtcd, sawNATS := 0, 0
	for _, o := range workloads(objs) {
		d := decodeSpec[deploymentSpec](t, o)
		secretVolumes := map[string]bool{}
		for _, v := range d.Template.Spec.Volumes {
			if v.Secret != nil {
				secretVolumes[v.Name] = true
			}
		}
		for _, c := range d.Template.Spec.Containers {
			where := o.Metadata.Name + "/" + c.Name
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			onSecret := func(name string) {
				path := env[name]
				if !assert.NotEmptyf(t, path, "%s: %s is not set", where, name) {
					return
				}
				ok := slices.ContainsFunc(c.VolumeMounts, func(m struct {
					Name      string `yaml:"name"`
					MountPath string `yaml:"mountPath"`
				}) bool {
					return secretVolumes[m.Name] && strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
				})
				assert.Truef(t, ok, "%s: %s=%s is not on a Secret volume", where, name, path)
			}
			for name, v := range env {
				if strings.HasSuffix(name, "_URL") || strings.HasSuffix(name, "_ENDPOINTS") {
					assert.NotContainsf(t, v, "http://", "%s: %s=%s is plaintext", where, name, v)
					assert.NotContainsf(t, v, "nats://", "%s: %s=%s is plaintext", where, name, v)
				}
				assert.NotContainsf(t, []string{"SWITCHYARD_NATS_PASSWORD", "SWITCHYARD_ETCD_PASSWORD", "SWITCHYARD_GOSSIP_SECRET_KEY"}, name,
					"%s: a secret in plain sight", where)
			}
			if eps, ok := env["SWITCHYARD_ETCD_ENDPOINTS"]; ok {
				sawEtcd++
				for _, ep := range strings.Split(eps, ",") {
					assert.Truef(t, strings.HasPrefix(ep, "https://"), "%s: etcd endpoint %s is not https://", where, ep)
				}
				for _, f := range []string{"SWITCHYARD_ETCD_CA_FILE", "SWITCHYARD_ETCD_CERT_FILE", "SWITCHYARD_ETCD_KEY_FILE"} {
					onSecret(f)
				}
			}
			if u, ok := env["SWITCHYARD_NATS_URL"]; ok {
				sawNATS++
				assert.Truef(t, strings.HasPrefix(u, "tls://"), "%s: NATS URL %s is not tls://", where, u)
				assert.NotEmptyf(t, env["SWITCHYARD_NATS_USER"], "%s: no NATS user", where)
				for _, f := range []string{"SWITCHYARD_NATS_CA_FILE", "SWITCHYARD_NATS_CERT_FILE", "SWITCHYARD_NATS_KEY_FILE", "SWITCHYARD_NATS_PASSWORD_FILE"} {
					onSecret(f)
				}
			}
			if slices.Contains(c.Args, "router") {
				for _, f := range []string{"SWITCHYARD_HTTP_TLS_CERT_FILE", "SWITCHYARD_HTTP_TLS_KEY_FILE", "SWITCHYARD_HTTP_ENGINE_TLS_CA_FILE",
					"SWITCHYARD_HTTP_ENGINE_TLS_CERT_FILE", "SWITCHYARD_AUTH_KEYS_FILE", "SWITCHYARD_GOSSIP_KEYRING_FILE"} {
					onSecret(f)
				}
				assert.NotEmptyf(t, env["SWITCHYARD_HTTP_ADMIN_ADDR"], "%s: /metrics and /debug/* must leave the API port", where)
			}
			if slices.Contains(c.Args, "worker") || slices.Contains(c.Args, "adapter") {
				for _, f := range []string{"SWITCHYARD_TLS_CERT_FILE", "SWITCHYARD_TLS_KEY_FILE", "SWITCHYARD_TLS_CLIENT_CA_FILE"} {
					onSecret(f)
				}
			}
			if c.Name == "etcd" {
				for _, a := range c.Args {
					for _, flag := range []string{"--listen-client-urls=", "--advertise-client-urls=", "--listen-peer-urls="} {
						if v, ok := strings.CutPrefix(a, flag); ok {
							assert.Truef(t, strings.HasPrefix(v, "https://"), "%s: %s", where, a)
						}
					}
				}
				assert.Contains(t, c.Args, "--client-cert-auth", "etcd must require client certificates")
			}
		}
	}
	assert.Positive(t, sawEtcd, "no workload reaches etcd")
	assert.Positive(t, sawNATS, "no workload reaches NATS")
}

// checkNetworkPolicies asserts that an ingress NetworkPolicy selects the
// pods of every workload, and that etcd's and NATS' admit only the tier.
func checkNetworkPolicies(t *testing.T, objs []object) {
	t.Helper()
	var pols []networkPolicySpec
	for _, o := range byKind(objs, "NetworkPolicy") {
		pols = append(pols, decodeSpec[networkPolicySpec](t, o))
	}
	for _, o := range workloads(objs) {
		labels := decodeSpec[deploymentSpec](t, o).Template.Metadata.Labels
		var selecting []networkPolicySpec
		for _, p := range pols {
			if slices.Contains(p.PolicyTypes, "Ingress") && subset(p.PodSelector.MatchLabels, labels) {
				selecting = append(selecting, p)
			}
		}
		require.NotEmptyf(t, selecting, "no NetworkPolicy selects the pods of %s %s", o.Kind, o.Metadata.Name)
		name := labels["app.kubernetes.io/name"]
		for _, p := range selecting {
			for _, rule := range p.Ingress {
				if name == "switchyard-router" {
					continue // clients reach routers from anywhere
				}
				require.NotEmptyf(t, rule.From, "%s: an ingress rule open to every source", name)
				for _, peer := range rule.From {
					assert.Nilf(t, peer.IPBlock, "%s: admits an IP block", name)
					assert.Nilf(t, peer.NamespaceSelector, "%s: admits another namespace", name)
					require.NotNilf(t, peer.PodSelector, "%s: a peer without a pod selector", name)
					allowed := []string{}
					if v := peer.PodSelector.MatchLabels["app.kubernetes.io/name"]; v != "" {
						allowed = append(allowed, v)
					}
					for _, e := range peer.PodSelector.MatchExpressions {
						if e.Key == "app.kubernetes.io/name" && e.Operator == "In" {
							allowed = append(allowed, e.Values...)
						}
					}
					require.NotEmptyf(t, allowed, "%s: a peer selector that names no component", name)
					for _, a := range allowed {
						switch name {
						case "switchyard-etcd", "switchyard-nats":
							assert.Containsf(t, tier, a, "%s admits %s, which is not of the tier", name, a)
						default: // workers and engines: routers only
							assert.Equalf(t, "switchyard-router", a, "%s admits %s", name, a)
						}
					}
				}
			}
		}
	}
}

func TestEveryLinkOfTheManifestsHasTLSAndCredentials(t *testing.T) {
	checkLinks(t, loadManifests(t))
	checkLinks(t, loadVLLMManifests(t))
}

func TestANetworkPolicySelectsEveryComponentAndEtcdAndNATSAdmitOnlyTheTier(t *testing.T) {
	checkNetworkPolicies(t, loadManifests(t))
	checkNetworkPolicies(t, loadVLLMManifests(t))
}
