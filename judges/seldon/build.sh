#!/usr/bin/env bash
# Build seldon-judge (Seldon Core v1's own webhook validation and controller object generation, as
# a test tool; see main.go) into a cache keyed by version and source digest.
#
#   judges/seldon/build.sh        -> prints the binary's path on stdout; progress on stderr
#
# Output: ${FORGE_CACHE:-$HOME/.cache/forge}/bin/seldon-judge-<operator version>-<digest>/seldon-judge.
#
# The Go module proxy refuses github.com/seldonio/seldon-core/operator (every version; tried first,
# see seldon_operator_src in scripts/cluster/gocache.sh). Its source, unchanged from the upstream
# tag (Apache-2.0), is in ../shared/vendor-src beside the checkout:
#   <checkout>/../shared/vendor-src/seldon-core-<SELDON_OPERATOR_VERSION>/operator
# (FORGE_SELDON_OPERATOR_SRC points elsewhere). go.mod replaces the module with that folder; the
# build uses a copy of go.mod whose replace is that folder's absolute path, so a checkout anywhere
# (a worktree, CI) builds the same. Every other module comes from the proxy (judges/seldon/go.sum).
# The version is SELDON_OPERATOR_VERSION of scripts/cluster/versions.env: go.mod must require it,
# and the source folder's SOURCE.md (when there is one) must name it.
# The digest covers go.mod, go.sum, *.go, the operator's Go sources and the Go version.
# Module and build caches are those of scripts/cluster/build.sh (${FORGE_CACHE}/go/{mod,build}).
# First build: about 2 min on 2 cores (controller-runtime 0.11, client-go 0.24, Istio's client).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../../scripts/cluster/versions.env
source "$repo/scripts/cluster/versions.env"
mod="$SELDON_OPERATOR_MODULE"
ver="$SELDON_OPERATOR_VERSION"

pinned="$(awk -v m="$mod" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$here/go.mod")"
if [[ "$pinned" != "$ver" ]]; then
  echo "seldon-judge: judges/seldon/go.mod requires $mod ${pinned:-(nothing)}, versions.env pins $ver; update both together" >&2
  exit 1
fi

# shellcheck source=../../scripts/cluster/gocache.sh
source "$repo/scripts/cluster/gocache.sh"
forge_go_env
# the source: the module proxy first (it refuses the module), then the checked vendored copy
seldon_operator_src seldon-judge
seldon_build seldon-judge seldon-judge "$here"
