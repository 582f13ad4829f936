package k8s

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gopkg.in/yaml.v3"

	"github.com/switchyard/switchyard/frontend"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The subset of the Kubernetes objects the checks read.
type (
	object struct {
		APIVersion string   `yaml:"apiVersion"`
		Kind       string   `yaml:"kind"`
		Metadata   metadata `yaml:"metadata"`
		Spec       yaml.Node
		Data       map[string]string `yaml:"data"`
		Resources  []string          `yaml:"resources"`
		file       string
	}
	metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	}
	deploymentSpec struct {
		Replicas *int          `yaml:"replicas"`
		Selector labelSelector `yaml:"selector"`
		Template struct {
			Metadata metadata `yaml:"metadata"`
			Spec     podSpec  `yaml:"spec"`
		} `yaml:"template"`
	}
	labelSelector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	podSpec struct {
		Containers []container `yaml:"containers"`
		Volumes    []struct {
			Name      string `yaml:"name"`
			ConfigMap *struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
			Secret *struct {
				SecretName string `yaml:"secretName"`
			} `yaml:"secret"`
		} `yaml:"volumes"`
	}
	container struct {
		Name  string   `yaml:"name"`
		Image string   `yaml:"image"`
		Args  []string `yaml:"args"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
			Protocol      string `yaml:"protocol"`
		} `yaml:"ports"`
		Env []struct {
			Name      string `yaml:"name"`
			Value     string `yaml:"value"`
			ValueFrom *struct {
				SecretKeyRef *struct {
					Name string `yaml:"name"`
					Key  string `yaml:"key"`
				} `yaml:"secretKeyRef"`
			} `yaml:"valueFrom"`
		} `yaml:"env"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
		ReadinessProbe *struct {
			HTTPGet struct {
				Path string    `yaml:"path"`
				Port yaml.Node `yaml:"port"`
			} `yaml:"httpGet"`
		} `yaml:"readinessProbe"`
	}
	serviceSpec struct {
		Type      string            `yaml:"type"`
		ClusterIP string            `yaml:"clusterIP"`
		Selector  map[string]string `yaml:"selector"`
		Ports     []struct {
			Name       string    `yaml:"name"`
			Port       int       `yaml:"port"`
			TargetPort yaml.Node `yaml:"targetPort"`
			Protocol   string    `yaml:"protocol"`
		} `yaml:"ports"`
	}
	hpaSpec struct {
		ScaleTargetRef struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
			Name       string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MinReplicas int `yaml:"minReplicas"`
		MaxReplicas int `yaml:"maxReplicas"`
		Metrics     []struct {
			Type string `yaml:"type"`
			Pods *struct {
				Metric struct {
					Name string `yaml:"name"`
				} `yaml:"metric"`
				Target struct {
					Type         string `yaml:"type"`
					AverageValue string `yaml:"averageValue"`
				} `yaml:"target"`
			} `yaml:"pods"`
		} `yaml:"metrics"`
	}
	pdbSpec struct {
		MinAvailable int           `yaml:"minAvailable"`
		Selector     labelSelector `yaml:"selector"`
	}
)

// apiVersions is the stable apiVersion of every kind the manifests may use.
var apiVersions = map[string]string{
	"Deployment":              "apps/v1",
	"StatefulSet":             "apps/v1",
	"NetworkPolicy":           "networking.k8s.io/v1",
	"Service":                 "v1",
	"ConfigMap":               "v1",
	"HorizontalPodAutoscaler": "autoscaling/v2",
	"PodDisruptionBudget":     "policy/v1",
	"Kustomization":           "kustomize.config.k8s.io/v1beta1",
}

func loadManifests(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("base", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var out []object
	for _, path := range files {
		f := filepath.Base(path) // as the kustomization lists it
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for i := 0; ; i++ {
			var o object
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoErrorf(t, err, "%s document %d", f, i)
			if o.Kind == "" && o.APIVersion == "" {
				continue // an empty document between two ---
			}
			o.file = f
			out = append(out, o)
		}
	}
	return out
}

func decodeSpec[T any](t *testing.T, o object) T {
	t.Helper()
	var s T
	require.NoErrorf(t, o.Spec.Decode(&s), "%s %s spec", o.Kind, o.Metadata.Name)
	return s
}

func byKind(objs []object, kind string) []object {
	var out []object
	for _, o := range objs {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestEveryManifestHasAKnownKindItsStableAPIVersionAndAName(t *testing.T) {
	objs := loadManifests(t)
	seen := map[string]bool{}
	for _, o := range objs {
		want, ok := apiVersions[o.Kind]
		if !assert.Truef(t, ok, "%s: unexpected kind %q", o.file, o.Kind) {
			continue
		}
		assert.Equalf(t, want, o.APIVersion, "%s: %s apiVersion", o.file, o.Kind)
		if o.Kind == "Kustomization" {
			continue
		}
		assert.NotEmptyf(t, o.Metadata.Name, "%s: %s without a name", o.file, o.Kind)
		key := o.Kind + "/" + o.Metadata.Name
		assert.Falsef(t, seen[key], "%s defined twice", key)
		seen[key] = true
	}
	for _, kind := range []string{"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler"} {
		assert.NotEmptyf(t, byKind(objs, kind), "no %s", kind)
	}
}

func TestTheKustomizationListsEveryManifestFile(t *testing.T) {
	objs := loadManifests(t)
	ks := byKind(objs, "Kustomization")
	require.Len(t, ks, 1)
	files := map[string]bool{}
	for _, o := range objs {
		if o.Kind != "Kustomization" {
			files[o.file] = true
		}
	}
	for f := range files {
		assert.Containsf(t, ks[0].Resources, f, "kustomization.yaml does not list %s", f)
	}
	for _, r := range ks[0].Resources {
		assert.Truef(t, files[r], "kustomization.yaml lists %s, which holds no manifest", r)
	}
}

// workloads are the Deployments and StatefulSets (their specs share the
// fields the checks read).
func workloads(objs []object) []object {
	return append(byKind(objs, "Deployment"), byKind(objs, "StatefulSet")...)
}

func TestDeploymentSelectorsMatchTheirPodTemplates(t *testing.T) {
	for _, o := range workloads(loadManifests(t)) {
		d := decodeSpec[deploymentSpec](t, o)
		assert.Truef(t, subset(d.Selector.MatchLabels, d.Template.Metadata.Labels),
			"Deployment %s: selector %v does not select its template's labels %v", o.Metadata.Name, d.Selector.MatchLabels, d.Template.Metadata.Labels)
		require.NotEmptyf(t, d.Template.Spec.Containers, "Deployment %s has no containers", o.Metadata.Name)
		for _, c := range d.Template.Spec.Containers {
			assert.NotEmptyf(t, c.Image, "Deployment %s container %s has no image", o.Metadata.Name, c.Name)
			assert.NotEmptyf(t, c.Args, "Deployment %s container %s names no subcommand", o.Metadata.Name, c.Name)
			if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet.Port.Value != "" {
				assert.Truef(t, portExists(c, c.ReadinessProbe.HTTPGet.Port, "TCP"),
					"Deployment %s: readiness probe port %q is not a container port", o.Metadata.Name, c.ReadinessProbe.HTTPGet.Port.Value)
			}
		}
	}
}

// portExists reports whether a Service targetPort or probe port (a name or
// a number) names one of c's ports with the protocol.
func portExists(c container, port yaml.Node, protocol string) bool {
	for _, p := range c.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = "TCP"
		}
		if proto != protocol {
			continue
		}
		if port.Tag == "!!int" && port.Value == strconv.Itoa(p.ContainerPort) {
			return true
		}
		if port.Tag == "!!str" && port.Value == p.Name {
			return true
		}
	}
	return false
}

func TestServicesSelectPodsWhoseContainersExposeTheirTargetPorts(t *testing.T) {
	objs := loadManifests(t)
	deps := workloads(objs)
	for _, o := range byKind(objs, "Service") {
		s := decodeSpec[serviceSpec](t, o)
		if s.Type == "ExternalName" {
			assert.Emptyf(t, s.Selector, "Service %s: an ExternalName service selects no pods", o.Metadata.Name)
			continue
		}
		var matched []deploymentSpec
		for _, d := range deps {
			ds := decodeSpec[deploymentSpec](t, d)
			if subset(s.Selector, ds.Template.Metadata.Labels) {
				matched = append(matched, ds)
			}
		}
		require.NotEmptyf(t, matched, "Service %s: selector %v matches no pod template", o.Metadata.Name, s.Selector)
		require.NotEmptyf(t, s.Ports, "Service %s has no ports", o.Metadata.Name)
		for _, p := range s.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = "TCP"
			}
			target := p.TargetPort
			if target.Kind == 0 { // absent: the port itself
				target = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(p.Port)}
			}
			for _, d := range matched {
				found := slices.ContainsFunc(d.Template.Spec.Containers, func(c container) bool { return portExists(c, target, proto) })
				assert.Truef(t, found, "Service %s port %s: targetPort %q/%s is no container port", o.Metadata.Name, p.Name, target.Value, proto)
			}
		}
	}
}

func TestTheRouterHPAScalesTheRouterDeploymentOnQueueDepthPerPod(t *testing.T) {
	objs := loadManifests(t)
	hpas := byKind(objs, "HorizontalPodAutoscaler")
	require.Len(t, hpas, 1)
	h := decodeSpec[hpaSpec](t, hpas[0])
	assert.Equal(t, "Deployment", h.ScaleTargetRef.Kind)
	assert.Equal(t, "apps/v1", h.ScaleTargetRef.APIVersion)
	names := map[string]bool{}
	for _, d := range byKind(objs, "Deployment") {
		names[d.Metadata.Name] = true
	}
	assert.Truef(t, names[h.ScaleTargetRef.Name], "HPA targets %s, which is not a Deployment here", h.ScaleTargetRef.Name)
	assert.Positive(t, h.MinReplicas)
	assert.LessOrEqual(t, h.MinReplicas, h.MaxReplicas)
	require.Len(t, h.Metrics, 1)
	m := h.Metrics[0]
	assert.Equal(t, "Pods", m.Type)
	require.NotNil(t, m.Pods)
	// The name the routers export (metrics.NameQueueDepth).
	assert.Equal(t, "switchyard_router_queue_depth", m.Pods.Metric.Name)
	assert.Equal(t, "AverageValue", m.Pods.Target.Type)
	assert.NotEmpty(t, m.Pods.Target.AverageValue)
}

func TestDisruptionBudgetsSelectADeploymentsPods(t *testing.T) {
	objs := loadManifests(t)
	for _, o := range byKind(objs, "PodDisruptionBudget") {
		p := decodeSpec[pdbSpec](t, o)
		found := false
		for _, d := range byKind(objs, "Deployment") {
			ds := decodeSpec[deploymentSpec](t, d)
			if subset(p.Selector.MatchLabels, ds.Template.Metadata.Labels) {
				found = true
				require.NotNil(t, ds.Replicas)
				assert.Lessf(t, p.MinAvailable, *ds.Replicas, "PDB %s would block every eviction", o.Metadata.Name)
			}
		}
		assert.Truef(t, found, "PDB %s selects no pods", o.Metadata.Name)
	}
}

func TestThePolicyConfigMapParsesWithTheRoutersParserAndIsMountedWhereTheRouterReadsIt(t *testing.T) {
	objs := loadManifests(t)
	var cm *object
	for i, o := range byKind(objs, "ConfigMap") {
		if o.Metadata.Name == "switchyard-policy" {
			cm = &byKind(objs, "ConfigMap")[i]
		}
	}
	require.NotNil(t, cm, "no ConfigMap switchyard-policy")
	doc, ok := cm.Data["policy.yaml"]
	require.True(t, ok, "switchyard-policy has no policy.yaml key")
	p, err := frontend.ParsePolicy([]byte(doc))
	require.NoError(t, err)
	assert.Contains(t, p.ClassNames(), "interactive")
	// The same policy the compose deployment and `switchyard up` use.
	builtIn, err := os.ReadFile(filepath.Join("..", "policy.yaml"))
	require.NoError(t, err)
	assert.Equal(t, string(builtIn), doc, "the ConfigMap's policy.yaml must be deploy/policy.yaml verbatim")

	var router *deploymentSpec
	for _, d := range byKind(objs, "Deployment") {
		if d.Metadata.Name == "switchyard-router" {
			ds := decodeSpec[deploymentSpec](t, d)
			router = &ds
		}
	}
	require.NotNil(t, router, "no Deployment switchyard-router")
	c := router.Template.Spec.Containers[0]
	policyPath := ""
	for _, e := range c.Env {
		if e.Name == "SWITCHYARD_POLICY" {
			policyPath = e.Value
		}
	}
	require.NotEmpty(t, policyPath, "the router is not told where the policy file is")
	volume := ""
	for _, v := range router.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == "switchyard-policy" {
			volume = v.Name
		}
	}
	require.NotEmpty(t, volume, "no volume from the policy ConfigMap")
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.Name == volume && filepath.Join(m.MountPath, "policy.yaml") == policyPath {
			mounted = true
		}
	}
	assert.Truef(t, mounted, "SWITCHYARD_POLICY=%s is not policy.yaml in the mounted ConfigMap", policyPath)
}

func TestRoutersJoinGossipThroughAHeadlessServiceThatListsUnreadyPods(t *testing.T) {
	objs := loadManifests(t)
	var join string
	for _, d := range byKind(objs, "Deployment") {
		if d.Metadata.Name != "switchyard-router" {
			continue
		}
		for _, e := range decodeSpec[deploymentSpec](t, d).Template.Spec.Containers[0].Env {
			if e.Name == "SWITCHYARD_GOSSIP_JOIN" {
				join = e.Value
			}
		}
	}
	require.NotEmpty(t, join, "routers are given no gossip join address")
	host, _, _ := strings.Cut(join, ":")
	var svc *serviceSpec
	for _, o := range byKind(objs, "Service") {
		if o.Metadata.Name == host {
			s := decodeSpec[serviceSpec](t, o)
			svc = &s
		}
	}
	require.NotNilf(t, svc, "join address %s names no Service", join)
	assert.Equal(t, "None", svc.ClusterIP, "the gossip Service must be headless (one address per pod)")
	var full map[string]any
	for _, o := range byKind(objs, "Service") {
		if o.Metadata.Name == host {
			require.NoError(t, o.Spec.Decode(&full))
		}
	}
	assert.Equal(t, true, full["publishNotReadyAddresses"], "a starting router must be able to join before it is ready")
}

func TestRoutersRequireAGossipKeyringFromASecretMountedWhereTheyReadIt(t *testing.T) {
	objs := loadManifests(t)
	var spec deploymentSpec
	var full struct {
		Template struct {
			Spec struct {
				Volumes []struct {
					Name   string `yaml:"name"`
					Secret *struct {
						SecretName string `yaml:"secretName"`
						Optional   *bool  `yaml:"optional"`
					} `yaml:"secret"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	}
	for _, d := range byKind(objs, "Deployment") {
		if d.Metadata.Name == "switchyard-router" {
			spec = decodeSpec[deploymentSpec](t, d)
			require.NoError(t, d.Spec.Decode(&full))
		}
	}
	c := spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	require.Equal(t, "true", env["SWITCHYARD_GOSSIP_REQUIRE_ENCRYPTION"], "a router without a key must not start")
	file := env["SWITCHYARD_GOSSIP_KEYRING_FILE"]
	require.NotEmpty(t, file)
	secretMounted := false
	for _, m := range c.VolumeMounts {
		if !strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		for _, v := range full.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				require.NotEmpty(t, v.Secret.SecretName)
				require.True(t, v.Secret.Optional == nil || !*v.Secret.Optional, "the keyring Secret must not be optional")
				secretMounted = true
			}
		}
	}
	require.True(t, secretMounted, "%s is not on a Secret volume", file)
	require.NotContains(t, env, "SWITCHYARD_GOSSIP_SECRET_KEY", "no key in plain sight in the manifest")
}
