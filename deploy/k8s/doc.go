// Package k8s holds Switchyard's Kubernetes manifests and their offline
// validation. base/ is the deployment (etcd, NATS, routers, simulated
// workers, the policy ConfigMap and the NetworkPolicies; its
// kustomization's secretGenerator reads the files `go run ./deploy/gencerts
// -k8s -dir deploy/k8s/base/secrets` writes), applied with `kubectl apply -k
// deploy/k8s`; vllm/ is an overlay that replaces the simulated workers with
// vLLM pods and a `switchyard adapter` sidecar each.
//
// The tests need no kubectl: manifests_test.go parses every document and
// checks kinds, apiVersions, selectors against pod templates, Service
// target ports against container ports, the HPA's target and metric, and
// that the policy ConfigMap parses with the routers' own policy parser;
// vllm_test.go that the sidecar's variables name real adapter flags and its
// endpoints match vLLM's; security_test.go that every etcd endpoint is
// https:// and every NATS URL tls:// with a client certificate, a user and
// a password file from Secret volumes, that routers serve HTTPS with API
// keys and an admin listener, and that a NetworkPolicy selects each
// component (etcd and NATS admitting only the tier, workers and engines
// only routers); render_test.go runs the same checks on the output of
// kustomize itself (the library kubectl uses) for the base and the
// overlay; nats_test.go runs the NATS ConfigMap in an in-process server and
// shows a worker's credentials cannot touch admission subjects.
//
// The package has no code of its own and starts no goroutines.
package k8s
