// Package k8s holds Switchyard's Kubernetes manifests (the YAML files beside
// this one, applied with `kubectl apply -k deploy/k8s`) and their offline
// validation: manifests_test.go parses every document and checks kinds,
// apiVersions, selectors against pod templates, Service target ports against
// container ports, the HPA's target and metric, and that the policy
// ConfigMap parses with the routers' own policy parser. No kubectl needed.
// vllm/ is an overlay that replaces the simulated workers with vLLM pods
// and a `switchyard adapter` sidecar each; vllm_test.go checks that the
// sidecar's variables name real adapter flags and that its endpoints match
// vLLM's ports and KV events config.
//
// The package has no code of its own and starts no goroutines.
package k8s
