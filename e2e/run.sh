#!/usr/bin/env bash
# The docker-compose end-to-end suite (`make e2e`): builds the images, starts
# deploy/docker-compose.yml as project switchyard-e2e, waits for every
# container to be healthy, runs the scenarios (go test -tags e2e), always
# tears the project down (down -v), and prints the report.
#
# Environment: E2E_RATE (requests/s, default 25), E2E_LOAD_SECONDS (per
# scenario, default 24), E2E_RUN (go test -run filter), E2E_KEEP=1 (leave the
# project running for inspection; tear it down yourself), SKIP_BUILD=1.
set -euo pipefail
cd "$(dirname "$0")/.."

export COMPOSE_PROJECT_NAME=switchyard-e2e
export E2E_PROJECT=$COMPOSE_PROJECT_NAME
# The suite kills, stops and restarts containers itself, and Docker treats
# those as manual (no restart); a process that exits on its own (a router whose
# etcd session expired while it was cut off) is restarted, as a supervisor would.
export RESTART_POLICY=on-failure
export SWITCHYARD_CLUSTER=${SWITCHYARD_CLUSTER:-e2e}
GO=${GO:-go}
compose_file=deploy/docker-compose.yml
report=$(mktemp "${TMPDIR:-/tmp}/switchyard-e2e-report.XXXXXX")
logs=${E2E_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/switchyard-e2e-logs.XXXXXX")}
export E2E_REPORT=$report

# Compose v2 plugin if there is one, else docker-compose v1 (1.28+ for profiles).
if docker compose version >/dev/null 2>&1; then
  compose() { docker compose -p "$COMPOSE_PROJECT_NAME" -f "$compose_file" "$@"; }
else
  compose() { docker-compose -p "$COMPOSE_PROJECT_NAME" -f "$compose_file" "$@"; }
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
  step "e2e finished with exit code $rc"
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
"$GO" test -tags e2e -count=1 -timeout 30m -v ${E2E_RUN:+-run "$E2E_RUN"} ./e2e/... 2>&1 | tee "$logs/go-test.log" || rc=$?
exit "$rc"
