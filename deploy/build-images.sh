#!/usr/bin/env bash
# Builds the static binaries of Switchyard, etcd (deploy/etcd) and NATS (deploy/nats) into a
# temporary directory and the three FROM-scratch images from them. Needs only Go and Docker:
# no base image is pulled. Independent of the Makefile.
#
#   deploy/build-images.sh            # switchyard:dev, switchyard-etcd:dev, switchyard-nats:dev
#   TAG=v1 deploy/build-images.sh     # other tag
#   SWITCHYARD_IMAGE=reg/sy:1 ETCD_IMAGE=reg/etcd:1 NATS_IMAGE=reg/nats:1 deploy/build-images.sh
#
# The compose file reads the same SWITCHYARD_IMAGE, ETCD_IMAGE and NATS_IMAGE variables.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${TAG:-dev}
SWITCHYARD_IMAGE=${SWITCHYARD_IMAGE:-switchyard:$TAG}
ETCD_IMAGE=${ETCD_IMAGE:-switchyard-etcd:$TAG}
NATS_IMAGE=${NATS_IMAGE:-switchyard-nats:$TAG}
GO=${GO:-go}

ctx=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-images.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/switchyard" "$ctx/etcd/data" "$ctx/nats"

build() { # build <output> <package>
  echo "go build $2"
  CGO_ENABLED=0 "$GO" build -trimpath -ldflags='-s -w' -o "$1" "$2"
}
build "$ctx/switchyard/switchyard" ./cmd/switchyard
build "$ctx/etcd/etcd" ./deploy/etcd
build "$ctx/nats/nats-server" ./deploy/nats

image() { # image <tag> <dockerfile> <context>
  echo "docker build $1"
  docker build --quiet -t "$1" -f "$2" "$3" >/dev/null
}
image "$SWITCHYARD_IMAGE" deploy/Dockerfile "$ctx/switchyard"
image "$ETCD_IMAGE" deploy/Dockerfile.etcd "$ctx/etcd"
image "$NATS_IMAGE" deploy/Dockerfile.nats "$ctx/nats"
echo "built $SWITCHYARD_IMAGE $ETCD_IMAGE $NATS_IMAGE"
