#!/usr/bin/env bash
# Checks the dependency rules of style.md mechanically:
#  - scheduler and kvindex import nothing of ours but leaf packages;
#  - scheduler and kvindex import no network, etcd, NATS or memberlist package;
#  - the adapters (cluster, gossip, frontend, engine, admission, kvingest, opspage) never import each other;
#  - internal/app is imported only by cmd/ and e2e/; internal/testenv never by non-test code;
#  - embedded etcd and nats-server are linked into cmd/switchyard only through internal/app.
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(go list -m)
fail=0
err() { echo "depcheck: $*" >&2; fail=1; }

# internal/clock is the one clock every package takes: a leaf that leaves may use.
leaf=(wire tokenizer metrics tenant anthropic internal/clock internal/listflag)
is_leaf() { local p=$1; for l in "${leaf[@]}"; do [[ $p == "$mod/$l" || $p == "$mod/$l/"* ]] && return 0; done; return 1; }

# Leaf packages import nothing of ours but the clock.
while read -r pkg imports; do
  for imp in $imports; do
    [[ $imp == "$mod"* && $imp != "$mod/internal/clock" ]] && err "$pkg is a leaf package but imports $imp"
  done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' $(for l in "${leaf[@]}"; do echo "./$l/..."; done) 2>/dev/null)

# Core packages import only leaf packages of ours; the scheduler does no I/O.
while read -r pkg imports; do
  for imp in $imports; do
    if [[ $imp == "$mod"* ]] && ! is_leaf "$imp"; then
      [[ $pkg == "$mod/scheduler"* && $imp == "$mod/scheduler"* ]] && continue
      [[ $pkg == "$mod/kvindex"* && $imp == "$mod/kvindex"* ]] && continue
      err "$pkg (core) imports $imp, which is not a leaf package"
    fi
    # Neither core does I/O: kvindex's NATS ingest is the adapter kvingest.
    if [[ $pkg == "$mod/scheduler"* || $pkg == "$mod/kvindex"* ]]; then
      case $imp in
        net|net/*|go.etcd.io/*|github.com/nats-io/*|github.com/hashicorp/memberlist*|os/exec)
          err "$pkg (core) imports $imp: the scheduler and kvindex cores do no I/O" ;;
      esac
    fi
  done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./scheduler/... ./kvindex/... 2>/dev/null)

# Adapters never import each other.
adapters=(cluster gossip frontend engine admission kvingest opspage)
for a in "${adapters[@]}"; do
  [ -d "$a" ] || continue
  while read -r pkg imports; do
    for imp in $imports; do
      for b in "${adapters[@]}"; do
        [[ $b == "$a" ]] && continue
        [[ $imp == "$mod/$b" || $imp == "$mod/$b/"* ]] && err "$pkg imports adapter $imp"
      done
    done
  done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' "./$a/..." 2>/dev/null)
done

# internal/app only from cmd/ and e2e/; internal/testenv never from non-test code.
while read -r pkg imports; do
  for imp in $imports; do
    if [[ $imp == "$mod/internal/app"* && $pkg != "$mod/cmd/"* && $pkg != "$mod/e2e"* && $pkg != "$mod/internal/app"* ]]; then
      err "$pkg imports $imp (internal/app is for cmd/ and e2e/ only)"
    fi
    if [[ $imp == "$mod/internal/testenv"* && $pkg != "$mod/internal/testenv"* ]]; then
      err "$pkg imports $imp from non-test code"
    fi
  done
done < <(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./... 2>/dev/null)

# Embedded servers reach the binary only through internal/app (switchyard up).
if [ -d cmd/switchyard ]; then
  while read -r pkg imports; do
    for imp in $imports; do
      case $imp in
        go.etcd.io/etcd/server/v3/embed|github.com/nats-io/nats-server/v2/server)
          [[ $pkg == "$mod/internal/app" ]] || err "$pkg links embedded server $imp into cmd/switchyard (only internal/app's up wiring may)" ;;
      esac
    done
  done < <(go list -deps -f '{{if .Module}}{{if eq .Module.Path "'"$mod"'"}}{{.ImportPath}} {{join .Imports " "}}{{end}}{{end}}' ./cmd/switchyard 2>/dev/null)
fi

if [ $fail -ne 0 ]; then exit 1; fi
echo "depcheck: dependency rules hold"
