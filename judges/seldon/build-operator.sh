#!/usr/bin/env bash
# Build Seldon Core v1's operator, the `manager` binary of upstream's operator/Dockerfile (the
# operator module's root `main` package), into a cache keyed by version and source digest, for
# devkit/node/seldon.py to run on the host against the node's cluster.
#
#   judges/seldon/build-operator.sh   -> prints the binary's path on stdout; progress on stderr
#
# Output: ${FORGE_CACHE:-$HOME/.cache/forge}/bin/seldon-operator-<SELDON_OPERATOR_VERSION>-<digest>/manager.
#
# Source: seldon_operator_src (scripts/cluster/gocache.sh): the module proxy first — it refuses
# github.com/seldonio/seldon-core/operator (403 "This module version is not available.") — then the
# unchanged upstream copy in ../shared/vendor-src beside the checkout, checked to be that module
# and to name SELDON_OPERATOR_VERSION in its SOURCE.md.
# Module: the operator's OWN go.mod and go.sum (upstream's pins, what its Dockerfile builds), used
# through a copy (-modfile) because the vendored folder is read-only; -mod=readonly, so every
# dependency is checked against upstream's go.sum. judges/seldon's go.sum does not cover the main
# package (it lacks go.uber.org/automaxprocs and github.com/ghodss/yaml).
# The executor is built by build-executor.sh; Forge renders every SeldonDeployment with
# seldon.io/no-engine "true", so the node does not run it.
# The digest covers the operator's Go sources (its go.mod and go.sum included) and the Go version.
# First build: see docs/test-cluster.md ("Seldon Core on the node").
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../../scripts/cluster/versions.env
source "$repo/scripts/cluster/versions.env"
# shellcheck source=../../scripts/cluster/gocache.sh
source "$repo/scripts/cluster/gocache.sh"
forge_go_env
if [[ "${1:-}" == executor ]]; then  # build-executor.sh: the executor, with the operator as its _operator
  export CGO_ENABLED=1
  if ! command -v gcc >/dev/null; then  # cgo's C compiler and libc headers, from Debian's packages
    echo "seldon-executor: installing gcc and libc6-dev for cgo" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends gcc libc6-dev >&2
  fi
  seldon_src seldon-executor executor
  executor_src="$src"
  seldon_operator_src seldon-executor
  seldon_build seldon-executor executor "$executor_src" ./cmd/executor
else
  seldon_operator_src seldon-operator
  seldon_build seldon-operator manager "$src"
fi
