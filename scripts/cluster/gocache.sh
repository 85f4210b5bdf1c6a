# shellcheck shell=bash
# Sourced by the Go builds (scripts/cluster/build.sh, judges/promop/build.sh, judges/seldon/build.sh):
# the forge cache's Go environment, the digests their cache keys are made of, and the cached,
# locked, atomic build of one binary. Nothing runs when it is sourced.
#
#   forge_go_env                     export GOMODCACHE/GOCACHE (${FORGE_CACHE:-~/.cache/forge}/go/{mod,build}),
#                                    GOFLAGS, GOTOOLCHAIN (local unless set), CGO_ENABLED=0; set $cache
#   go_module_text DIR               DIR's go.mod, go.sum and *.go, concatenated (a module's own sources)
#   go_sources DIR [find tests...]   "sha256  ./path" of every *.go, go.mod and go.sum below DIR, sorted by
#                                    path (find tests such as ! -name '*_test.go' leave files out)
#   short_key N                      the first N hex digits of the sha256 of stdin
#   cached_build OUT NAME LOCK FN    print OUT/NAME; when it is not there yet, under flock on LOCK (checked
#                                    again after waiting), run `FN TMP`, which writes TMP/NAME, and rename
#                                    TMP to OUT (atomic: a reader never sees half a build). Call it as a
#                                    plain command under `set -e` (not in `if`, `||` or `$(...)`), so that a
#                                    failing step of FN stops the build before anything is installed

forge_go_env() {
  cache="${FORGE_CACHE:-$HOME/.cache/forge}"
  export GOMODCACHE="$cache/go/mod"
  export GOCACHE="$cache/go/build"
  export GOFLAGS="-trimpath -modcacherw -buildvcs=false"
  export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
  export CGO_ENABLED=0
}

go_module_text() {
  (cd "$1" && cat go.mod go.sum ./*.go)
}

go_sources() {
  local dir="$1"; shift
  (cd "$dir" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) "$@" | LC_ALL=C sort | xargs sha256sum)
}

short_key() {
  sha256sum | cut -c1-"$1"
}

cached_build() {
  local out="$1" name="$2" lock="$3" fn="$4"
  if [[ ! -x "$out/$name" ]]; then
    mkdir -p "$(dirname "$lock")"
    (
      set -e
      exec 9>"$lock"
      flock 9
      if [[ -x "$out/$name" ]]; then exit 0; fi
      local tmp="$out.tmp.$$"
      rm -rf "$tmp"; mkdir -p "$tmp"
      trap 'rm -rf "$tmp"' EXIT
      "$fn" "$tmp"
      rm -rf "$out"
      mv "$tmp" "$out"
      trap - EXIT
    )
  fi
  echo "$out/$name"
}
