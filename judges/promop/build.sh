#!/usr/bin/env bash
# Build promop (the Prometheus Operator's own config generator and rule selector, and Prometheus's own
# Kubernetes pod discovery, as a test tool; see main.go) into a cache keyed by version.
#
#   judges/promop/build.sh        -> prints the binary's path on stdout; progress on stderr
#
# Output: ${FORGE_CACHE:-$HOME/.cache/forge}/bin/promop-<operator version>-<source digest>/promop.
# The operator version is PROMETHEUS_OPERATOR_VERSION of scripts/cluster/versions.env and must be
# the one go.mod requires; the digest covers go.mod, go.sum and *.go, so an edit builds anew.
# Module and build caches are those of scripts/cluster/build.sh (${FORGE_CACHE}/go/{mod,build}).
# First build: about 5 min on 2 busy cores (the operator pulls in Prometheus and client-go).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../scripts/cluster/versions.env
source "$here/../../scripts/cluster/versions.env"

pinned="$(awk -v m="$PROMETHEUS_OPERATOR_MODULE" '$1 == m {print $2}' "$here/go.mod")"
if [[ "$pinned" != "$PROMETHEUS_OPERATOR_VERSION" ]]; then
  echo "promop: go.mod requires $PROMETHEUS_OPERATOR_MODULE ${pinned:-(nothing)}, versions.env pins $PROMETHEUS_OPERATOR_VERSION;" \
       "run: (cd judges/promop && go get $PROMETHEUS_OPERATOR_MODULE@$PROMETHEUS_OPERATOR_VERSION && go mod tidy)" >&2
  exit 1
fi

# shellcheck source=../../scripts/cluster/gocache.sh
source "$here/../../scripts/cluster/gocache.sh"
forge_go_env
digest="$(go_module_text "$here" | short_key 12)"

build() { # <tmp dir>
  echo "[build] promop ($PROMETHEUS_OPERATOR_MODULE $PROMETHEUS_OPERATOR_VERSION): compiling" >&2
  (cd "$here" && go build -p "${FORGE_BUILD_JOBS:-$(nproc)}" -ldflags "-s -w" -o "$1/promop" .)
  echo "[build] promop: built" >&2
}
cached_build "$cache/bin/promop-$PROMETHEUS_OPERATOR_VERSION-$digest" promop "$cache/bin/.promop.lock" build
