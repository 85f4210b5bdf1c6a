#!/usr/bin/env bash
# Build seldon-judge (Seldon Core v1's own webhook validation and controller object generation, as
# a test tool; see main.go) into a cache keyed by version and source digest.
#
#   judges/seldon/build.sh        -> prints the binary's path on stdout; progress on stderr
#
# Output: ${FORGE_CACHE:-$HOME/.cache/forge}/bin/seldon-judge-<operator version>-<digest>/seldon-judge.
#
# The Go module proxy refuses github.com/seldonio/seldon-core/operator (every version). Its source,
# unchanged from the upstream tag (Apache-2.0), is in ../shared/vendor-src beside the checkout:
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

src="${FORGE_SELDON_OPERATOR_SRC:-$repo/../shared/vendor-src/seldon-core-$ver/operator}"
if [[ ! -f "$src/go.mod" ]]; then
  echo "seldon-judge: no Seldon Core operator source at $src" >&2
  echo "  The Go module proxy refuses $mod; the build takes its $ver source from ../shared/vendor-src" >&2
  echo "  beside the checkout (or FORGE_SELDON_OPERATOR_SRC)." >&2
  exit 1
fi
src="$(cd "$src" && pwd)"
if [[ "$(awk '$1 == "module" {print $2; exit}' "$src/go.mod")" != "$mod" ]]; then
  echo "seldon-judge: $src/go.mod is not module $mod" >&2
  exit 1
fi
if [[ -f "$src/../SOURCE.md" ]] && ! grep -qF "$ver" "$src/../SOURCE.md"; then
  echo "seldon-judge: $src/../SOURCE.md does not name $ver (versions.env's SELDON_OPERATOR_VERSION)" >&2
  exit 1
fi

cache="${FORGE_CACHE:-$HOME/.cache/forge}"
export GOMODCACHE="$cache/go/mod"
export GOCACHE="$cache/go/build"
export GOFLAGS="-trimpath -modcacherw -buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED=0

digest="$(
  {
    (cd "$here" && cat go.mod go.sum ./*.go)
    (cd "$src" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) ! -name '*_test.go' \
       ! -path './testing/*' | LC_ALL=C sort | xargs sha256sum)
    go env GOVERSION
  } | sha256sum | cut -c1-12
)"
out="$cache/bin/seldon-judge-$ver-$digest"
if [[ -x "$out/seldon-judge" ]]; then echo "$out/seldon-judge"; exit 0; fi

mkdir -p "$cache/bin"
exec 9>"$cache/bin/.seldon-judge.lock"
flock 9
if [[ -x "$out/seldon-judge" ]]; then echo "$out/seldon-judge"; exit 0; fi
echo "[build] seldon-judge ($mod $ver from $src): compiling" >&2
tmp="$out.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp/mod"
trap 'rm -rf "$tmp"' EXIT
# The same go.mod and go.sum, with the operator's replace made absolute.
cp "$here/go.mod" "$tmp/mod/go.mod"
cp "$here/go.sum" "$tmp/mod/go.sum"
go mod edit -replace="$mod=$src" "$tmp/mod/go.mod"
(cd "$here" && go build -mod=readonly -modfile="$tmp/mod/go.mod" -p "${FORGE_BUILD_JOBS:-$(nproc)}" \
   -ldflags "-s -w" -o "$tmp/seldon-judge" .)
rm -rf "$tmp/mod"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "[build] seldon-judge: built $out/seldon-judge" >&2
echo "$out/seldon-judge"
