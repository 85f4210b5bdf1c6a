# shellcheck shell=bash
# Sourced by the Go builds (scripts/cluster/build.sh, judges/promop/build.sh, judges/seldon/build.sh,
# judges/seldon/build-operator.sh, judges/seldon/build-executor.sh):
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
#   seldon_src NAME PART             set $src to Seldon Core's PART (operator or executor) source, module
#                                    SELDON_OPERATOR_MODULE with its last element PART, at SELDON_OPERATOR_VERSION
#                                    of versions.env (sourced by the caller; $repo set; one tag holds both):
#                                    the module proxy first, then, when it refuses (it does, every version, both
#                                    modules), ../shared/vendor-src/seldon-core-<version>/PART beside the checkout
#                                    (or FORGE_SELDON_OPERATOR_SRC / FORGE_SELDON_EXECUTOR_SRC), checked to be that
#                                    module, with a SOURCE.md naming that version. NAME prefixes the messages.
#                                    Needs forge_go_env
#   seldon_operator_src NAME         seldon_src NAME operator
#   seldon_build NAME BIN DIR [PKG]  print bin/NAME-<SELDON_OPERATOR_VERSION>-<digest>/BIN, building it (cached_build,
#                                    lock bin/.NAME.lock) the first time: DIR's package PKG (default: its main
#                                    package), -mod=readonly. DIR is one of
#                                    - $src (the operator itself): built with a copy (-modfile) of its go.mod/go.sum;
#                                    - a module of its own that requires the operator: the same, and the copy
#                                      replaces SELDON_OPERATOR_MODULE with $src; its go.mod, go.sum and *.go are
#                                      part of the digest;
#                                    - a module whose go.mod replaces the operator with ./_operator (upstream's
#                                      executor): built in a writable copy of DIR (under the build's temporary
#                                      folder) into which $src is copied as _operator (upstream's Makefile target
#                                      copy_operator), with DIR's own go.mod and go.sum; all of DIR's Go sources
#                                      (tests and any _operator left out) and CGO_ENABLED are part of the digest.
#                                    The digest also covers $src's Go sources (tests left out) and the Go version.
#                                    Needs forge_go_env and seldon_operator_src; a plain command

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

seldon_src() {
  local name="$1" part="$2" ver="$SELDON_OPERATOR_VERSION" mod json dir override
  mod="${SELDON_OPERATOR_MODULE%/operator}/$part"
  override="FORGE_SELDON_${part^^}_SRC"
  if [[ -z "${!override:-}" ]]; then
    # The proxy answers at once (403 "This module version is not available." for every version so far);
    # should it ever serve the module, its checked copy (go.sum database) is used instead.
    _seldon_proxy
    json="$(awk -v m="$mod" '/^\{/ {p = ""} $1 == "\"Path\":" {p = $2} p == "\"" m "\","' <<<"$_seldon_proxy_json")"
    dir="$(awk -F'"' '$2 == "Dir" {print $4}' <<<"$json")"
    if [[ -n "$dir" ]]; then
      src="$dir"
      echo "$name: $mod $ver from the module proxy" >&2
      return 0
    fi
    echo "$name: the module proxy refuses $mod $ver ($(awk -F'"' '$2 == "Error" {print $4}' <<<"$json" | sed 's/\\[nt]/ /g')); using the vendored copy" >&2
  fi
  src="${!override:-$repo/../shared/vendor-src/seldon-core-$ver/$part}"
  if [[ ! -f "$src/go.mod" ]]; then
    echo "$name: no Seldon Core $part source at $src" >&2
    echo "  The Go module proxy refuses $mod; the build takes its $ver source from ../shared/vendor-src" >&2
    echo "  beside the checkout (or $override)." >&2
    return 1
  fi
  src="$(cd "$src" && pwd)"
  if [[ "$(awk '$1 == "module" {print $2; exit}' "$src/go.mod")" != "$mod" ]]; then
    echo "$name: $src/go.mod is not module $mod" >&2
    return 1
  fi
  if [[ -f "$src/../SOURCE.md" ]] && ! grep -qF "$ver" "$src/../SOURCE.md"; then
    echo "$name: $src/../SOURCE.md does not name $ver (versions.env's SELDON_OPERATOR_VERSION)" >&2
    return 1
  fi
}

# `go mod download -json` of both Seldon Core modules at SELDON_OPERATOR_VERSION, asked once per shell, side by
# side (one go command asks for its arguments one after the other), into $_seldon_proxy_json; offline or
# refused: no Dir for that module
_seldon_proxy() {
  [[ -z "${_seldon_proxy_json+set}" ]] || return 0
  local base="${SELDON_OPERATOR_MODULE%/operator}" ver="$SELDON_OPERATOR_VERSION" tmp part
  tmp="$(mktemp -d)"
  for part in operator executor; do
    timeout 20 go mod download -json "$base/$part@$ver" >"$tmp/$part" 2>/dev/null &
  done
  wait || true
  _seldon_proxy_json="$(cat "$tmp/operator" "$tmp/executor")"
  rm -rf "$tmp"
}

seldon_operator_src() {
  seldon_src "$1" operator
}

# true when DIR's go.mod replaces the operator with ./_operator (upstream's executor)
_seldon_in_tree() {
  go mod edit -json "$1/go.mod" | grep -qF '"Path": "./_operator"'
}

seldon_build() {
  # sb_*: read by _seldon_compile, which cached_build runs (its own locals are out, name, lock, fn, tmp)
  local sb_name="$1" sb_bin="$2" sb_dir="$3" sb_pkg="${4:-.}" sb_tree= sb_key
  if [[ "$sb_dir" != "$src" ]] && _seldon_in_tree "$sb_dir"; then sb_tree=1; fi
  sb_key="$(
    {
      if [[ -n "$sb_tree" ]]; then go_sources "$sb_dir" ! -name '*_test.go' ! -path './_operator/*'; go env CGO_ENABLED
      elif [[ "$sb_dir" != "$src" ]]; then go_module_text "$sb_dir"; fi
      go_sources "$src" ! -name '*_test.go' ! -path './testing/*'
      go env GOVERSION
    } | short_key 12
  )"
  cached_build "$cache/bin/$sb_name-$SELDON_OPERATOR_VERSION-$sb_key" "$sb_bin" "$cache/bin/.$sb_name.lock" _seldon_compile
}

_seldon_compile() { # <tmp dir>, with seldon_build's sb_name, sb_bin, sb_dir, sb_pkg and sb_tree
  local tmp="$1" label="$sb_name" dir="$sb_dir" modfile=()
  [[ "$sb_bin" == "$sb_name" ]] || label+=" $sb_bin"
  echo "[build] $label ($SELDON_OPERATOR_MODULE $SELDON_OPERATOR_VERSION from $src): compiling${sb_tree:+ in a copy of $sb_dir}" >&2
  if [[ -n "$sb_tree" ]]; then
    # upstream's copy_operator (rm -rf _operator; cp -r ../operator _operator), in a writable copy
    dir="$tmp/src"
    mkdir -p "$dir"
    cp -R "$sb_dir/." "$dir/"
    chmod -R u+w "$dir"
    rm -rf "$dir/_operator"
    cp -R "$src" "$dir/_operator"
    chmod -R u+w "$dir/_operator"
  else
    mkdir -p "$tmp/mod"
    cp "$sb_dir/go.mod" "$tmp/mod/go.mod"
    cp "$sb_dir/go.sum" "$tmp/mod/go.sum"
    modfile=(-modfile="$tmp/mod/go.mod")
    # a module of its own: the same go.mod and go.sum, with the operator's replace made absolute
    if [[ "$sb_dir" != "$src" ]]; then go mod edit -replace="$SELDON_OPERATOR_MODULE=$src" "$tmp/mod/go.mod"; fi
  fi
  (cd "$dir" && go build -mod=readonly "${modfile[@]}" -p "${FORGE_BUILD_JOBS:-$(nproc)}" \
     -ldflags "-s -w" -o "$tmp/$sb_bin" "$sb_pkg")
  rm -rf "$tmp/mod" "$tmp/src"
  echo "[build] $label: built" >&2
}
