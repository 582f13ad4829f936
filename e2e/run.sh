#!/usr/bin/env bash
# The docker-compose end-to-end suite (`make e2e`): builds the images, starts
# deploy/docker-compose.yml as project switchyard-e2e, waits for every
# container to be healthy, runs the scenarios (go test -tags e2e), always
# tears the project down (down -v), and prints the report.
#
# E2E_VARIANT picks the cluster: native (deploy/docker-compose.yml, the
# native scenarios), vllm (deploy/docker-compose.vllm.yml as project
# switchyard-e2e-vllm: vLLM-protocol engines behind adapters, the TestVLLM*
# scenarios), tls (deploy/docker-compose.yml with deploy/docker-compose.tls.yml
# as project switchyard-e2e-tls: TLS and credentials on every link, with a CA,
# certificates, gossip keyring and NATS passwords generated for the run by
# deploy/gencerts into a temporary directory; the native scenarios over
# HTTPS, metrics from the routers' admin listeners), pd
# (deploy/docker-compose.pd.yml as project switchyard-e2e-pd: two prefill,
# two decode and one both worker speaking vLLM's kv_transfer_params, the
# TestPD* scenarios), or all (the default: native, then vllm, tls and pd
# with the images already built; the exit code is the first failure's).
#
# Environment: E2E_RATE (requests/s, default 25), E2E_LOAD_SECONDS (per
# scenario, default 24), E2E_RUN (go test -run filter), E2E_KEEP=1 (leave the
# project running for inspection; tear it down yourself), SKIP_BUILD=1,
# E2E_LOGS (directory for the containers' logs, one subdirectory per variant).
# E2E_RUN replaces the vllm variant's ^TestVLLM filter, so with E2E_RUN name
# the variant too.
set -euo pipefail
cd "$(dirname "$0")/.."

export E2E_VARIANT=${E2E_VARIANT:-all}
# The compose files require a gossip key (the tls variant uses its keyring
# instead): one per run unless one is given.
if [[ -z ${SWITCHYARD_GOSSIP_SECRET_KEY:-} ]]; then
  SWITCHYARD_GOSSIP_SECRET_KEY=$(head -c 32 /dev/urandom | base64)
fi
export SWITCHYARD_GOSSIP_SECRET_KEY
case $E2E_VARIANT in
  all)
    rc=0
    # After the cd above, the script is ./e2e/run.sh whatever $0 was.
    E2E_VARIANT=native ./e2e/run.sh || rc=$?
    # The vLLM variant publishes the same loopback ports; the native project
    # is down by now (unless E2E_KEEP=1 left it up, which this refuses).
    if [[ ${E2E_KEEP:-0} == 1 ]]; then
      echo "E2E_KEEP=1 with E2E_VARIANT=all: not starting the vllm variant over the kept native project" >&2
      exit "$rc"
    fi
    vrc=0
    E2E_VARIANT=vllm SKIP_BUILD=1 ./e2e/run.sh || vrc=$?
    trc=0
    E2E_VARIANT=tls SKIP_BUILD=1 ./e2e/run.sh || trc=$?
    prc=0
    E2E_VARIANT=pd SKIP_BUILD=1 ./e2e/run.sh || prc=$?
    exit $(( rc != 0 ? rc : vrc != 0 ? vrc : trc != 0 ? trc : prc ))
    ;;
  native)
    export COMPOSE_PROJECT_NAME=switchyard-e2e
    compose_files=(-f deploy/docker-compose.yml)
    # The vLLM and PD scenarios skip themselves here; leave them out of the run.
    test_select=(-skip '^TestVLLM|^TestPD')
    ;;
  pd)
    export COMPOSE_PROJECT_NAME=switchyard-e2e-pd
    compose_files=(-f deploy/docker-compose.pd.yml)
    test_select=(-run "${E2E_RUN:-^TestPD}")
    ;;
  vllm)
    export COMPOSE_PROJECT_NAME=switchyard-e2e-vllm
    compose_files=(-f deploy/docker-compose.vllm.yml)
    test_select=(-run "${E2E_RUN:-^TestVLLM}")
    ;;
  tls)
    export COMPOSE_PROJECT_NAME=switchyard-e2e-tls
    compose_files=(-f deploy/docker-compose.yml -f deploy/docker-compose.tls.yml)
    test_select=(-skip '^TestVLLM|^TestPD')
    # Secrets for this run only, readable by the containers' user (65532).
    certs=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-e2e-certs.XXXXXX")
    chmod 755 "$certs"
    "${GO:-go}" run ./deploy/gencerts -dir "$certs"
    export SWITCHYARD_CERTS_DIR=$certs
    set -a
    # shellcheck source=/dev/null
    . "$certs/secrets.env"
    set +a
    # The scenarios: routers and workers over HTTPS trusting the run's CA;
    # the routers' /metrics and /debug/cluster on their admin listeners.
    export E2E_SCHEME=https E2E_CA_FILE=$certs/ca.crt E2E_ROUTER_ADMIN=1
    # The routers require an API key (keys.yaml); the driver sends this one.
    E2E_API_KEY=$(tr -d '[:space:]' <"$certs/api.key")
    export E2E_API_KEY
    ;;
  *)
    echo "E2E_VARIANT must be native, vllm, tls, pd or all, not $E2E_VARIANT" >&2
    exit 2
    ;;
esac
export E2E_PROJECT=$COMPOSE_PROJECT_NAME
# The suite kills, stops and restarts containers itself, and Docker treats
# those as manual (no restart); a process that exits on its own (a router whose
# etcd session expired while it was cut off) is restarted, as a supervisor would.
export RESTART_POLICY=on-failure
export SWITCHYARD_CLUSTER=${SWITCHYARD_CLUSTER:-e2e}
GO=${GO:-go}
report=$(mktemp "${TMPDIR:-/tmp}/switchyard-e2e-report.XXXXXX")
if [[ -n ${E2E_LOGS:-} ]]; then
  logs=$E2E_LOGS/$E2E_VARIANT # both variants' logs under one E2E_LOGS
  mkdir -p "$logs"
else
  logs=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-e2e-logs-$E2E_VARIANT.XXXXXX")
fi
export E2E_REPORT=$report

# Compose v2 plugin if there is one, else docker-compose v1 (1.28+ for profiles).
if docker compose version >/dev/null 2>&1; then
  compose() { docker compose -p "$COMPOSE_PROJECT_NAME" "${compose_files[@]}" "$@"; }
else
  compose() { docker-compose -p "$COMPOSE_PROJECT_NAME" "${compose_files[@]}" "$@"; }
fi

start=$(date +%s)
step() { echo "=== $* ($(( $(date +%s) - start ))s)"; }

teardown() {
  local rc=$?
  if [[ ${E2E_KEEP:-0} == 1 ]]; then
    step "E2E_KEEP=1: leaving $COMPOSE_PROJECT_NAME running"
  else
    step "saving logs to $logs and tearing down"
    for c in $(docker ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME"); do
      name=$(docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}}' "$c")
      docker logs "$c" >"$logs/$name.log" 2>&1 || true
    done
    compose down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  if [[ -s $report ]]; then cat "$report"; fi
  rm -f "$report"
  if [[ -n ${certs:-} && ${E2E_KEEP:-0} != 1 ]]; then rm -rf "$certs"; fi
  step "e2e ($E2E_VARIANT) finished with exit code $rc"
  exit "$rc"
}
trap teardown EXIT

# A previous run that was interrupted may have left the project behind.
compose down -v --remove-orphans >/dev/null 2>&1 || true

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  step "building images"
  deploy/build-images.sh
fi

step "starting $COMPOSE_PROJECT_NAME"
compose up -d

step "waiting for every container to be healthy"
deadline=$(( $(date +%s) + 180 ))
while :; do
  ids=$(docker ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME")
  total=$(wc -w <<<"$ids")
  healthy=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{end}}' $ids | grep -c '^healthy$' || true)
  if [[ $total -gt 0 && $healthy -eq $total ]]; then break; fi
  if (( $(date +%s) > deadline )); then
    echo "only $healthy of $total containers healthy after 180s:" >&2
    docker ps -a --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" >&2
    exit 1
  fi
  sleep 2
done
echo "$total containers healthy"

step "running the scenarios"
rc=0
if [[ $E2E_VARIANT != vllm && $E2E_VARIANT != pd && -n ${E2E_RUN:-} ]]; then test_select+=(-run "$E2E_RUN"); fi
"$GO" test -tags e2e -count=1 -timeout 30m -v "${test_select[@]}" ./e2e/... 2>&1 | tee "$logs/go-test.log" || rc=$?
exit "$rc"
