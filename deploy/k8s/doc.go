// Package k8s holds Switchyard's Kubernetes manifests (the YAML files beside
// this one, applied with `kubectl apply -k deploy/k8s`) and their offline
// validation: manifests_test.go parses every document and checks kinds,
// apiVersions, selectors against pod templates, Service target ports against
// container ports, the HPA's target and metric, and that the policy
// ConfigMap parses with the routers' own policy parser. No kubectl needed.
//
// The package has no code of its own and starts no goroutines.
package k8s
