// Package e2e is Switchyard's outer test tier: the docker-compose deployment
// (deploy/docker-compose.yml) under load while containers are killed, cut off
// and restarted. `make e2e` runs e2e/run.sh, which builds the images, starts
// the compose project switchyard-e2e, runs `go test -tags e2e ./e2e/...` and
// always tears the project down.
//
// The package has two halves. Without the e2e build tag it is a library and
// its unit tests (run by `make test`, no Docker needed): the load driver
// (Driver: streaming completions at a steady rate, one terminal Outcome per
// request), the SSE stream classifier (DecodeStream), the /debug/cluster
// decoder, Prometheus text scraping and the reset-aware counter sums, and the
// docker CLI wrapper. With the tag, scenarios_test.go drives the six fault
// scenarios against the running project and prints a report per scenario;
// pd_scenarios_test.go holds the TestPD* scenarios of the disaggregated
// variant (deploy/docker-compose.pd.yml, E2E_VARIANT=pd).
// vllm_scenarios_test.go holds the TestVLLM* scenarios of the vLLM variant
// (deploy/docker-compose.vllm.yml: vLLM-protocol engines behind adapters,
// E2E_VARIANT=vllm), which skip against the native project. The tls variant
// (E2E_VARIANT=tls: deploy/docker-compose.tls.yml over the native file) runs
// the native scenarios over HTTPS with an API key: E2E_SCHEME, E2E_CA_FILE
// (ClientTLS), E2E_API_KEY and E2E_ROUTER_ADMIN (metrics and /debug/cluster
// from the routers' admin listeners) tell them how to reach the cluster.
//
// Concurrency: Driver.Run owns every request goroutine it starts and returns
// only after all of them finished (each is bounded by RequestTimeout); its
// accessors are safe from any goroutine. CounterWatch.Run owns its poll loop
// the same way. Everything else is synchronous. The suite only ever talks to
// 127.0.0.1 (the ports the compose file publishes) and to the docker CLI.
package e2e
