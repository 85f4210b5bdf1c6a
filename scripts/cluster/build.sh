#!/usr/bin/env bash
# Build the test cluster's binaries from the Go module proxy into a cache keyed by version.
#
#   scripts/cluster/build.sh [etcd|kube-apiserver|all]    (default: all)
#   scripts/cluster/build.sh node     kubelet, kube-scheduler, kube-controller-manager, kube-proxy,
#                                     kubectl of the same KUBERNETES_VERSION
#   scripts/cluster/build.sh argo     Argo Workflows' workflow-controller and argoexec (ARGO_WORKFLOWS_VERSION)
#   scripts/cluster/build.sh promop   the Prometheus Operator and prometheus-config-reloader (PROMETHEUS_OPERATOR_VERSION),
#                                     and the Prometheus it deploys by default (bin/prometheus-<version>/prometheus)
#   scripts/cluster/build.sh traefik  Traefik (TRAEFIK_VERSION), its `go build ./cmd/traefik` in the module's own tree
#   scripts/cluster/build.sh kueue    Kueue's manager (KUEUE_VERSION), its `go build ./cmd/kueue` in the module's own tree
#   scripts/cluster/build.sh coredns  CoreDNS (COREDNS_VERSION), its Makefile's `go build` in the module's own tree
#   scripts/cluster/build.sh training-operator  the Kubeflow Training Operator (TRAINING_OPERATOR_VERSION),
#                                     its `go build ./cmd/training-operator.v1` in the module's own tree
#   scripts/cluster/build.sh judge                        (prints the binary's path on stdout)
#
# Output: ${FORGE_CACHE:-$HOME/.cache/forge}/bin/<name>-<version>/<name>
# forge-judge (the repo's judges/ module) goes to bin/forge-judge-<key>/forge-judge, where key
# hashes its sources, the pinned upstream versions and the Go version.
# A binary that is already there is reused; a new pinned version builds a new directory.
# Module and build caches live in ${FORGE_CACHE}/go/{mod,build} so nothing touches $HOME/go.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

# shellcheck source=gocache.sh
source "$here/gocache.sh"
forge_go_env  # sets $cache
jobs="${FORGE_BUILD_JOBS:-$(nproc)}"

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# atomic install: build into a temp dir next to the target, then rename
finish() { # <tmpdir> <outdir>
  rm -rf "$2"
  mv "$1" "$2"
}

build_etcd() {
  local out="$cache/bin/etcd-$ETCD_VERSION"
  if [[ -x "$out/etcd" ]]; then log "etcd $ETCD_VERSION: cached ($out/etcd)"; return; fi
  local src="$cache/src/etcd-$ETCD_VERSION"
  rm -rf "$src"; mkdir -p "$src"
  # The etcd server module's root is package main, and its go.mod has replace directives,
  # so `go install module@version` refuses it. A wrapper module that requires it works:
  # the server's own requirements name the matching go.etcd.io/etcd/{api,client,pkg} versions.
  cat >"$src/go.mod" <<GOMOD
module forge.local/cluster/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  log "etcd $ETCD_VERSION: resolving modules"
  (cd "$src" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
  log "etcd $ETCD_VERSION: compiling"
  local tmp="$out.tmp.$$"; mkdir -p "$tmp"
  (cd "$src" && go build -p "$jobs" -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
  "$tmp/etcd" --version >&2
  finish "$tmp" "$out"
  log "etcd $ETCD_VERSION: built $out/etcd"
}

# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
# ./staging/src/k8s.io/<name>. Those replaces do not apply to a module that requires it,
# so derive the list from the pinned go.mod and point each one at the published
# v0.<minor>.<patch> of the same release (v1.34.4 -> v0.34.4).
kube_wrapper() { # <src dir> <module name> <package>...: writes the wrapper module and resolves it
  local v="$KUBERNETES_VERSION" src="$1" modname="$2"; shift 2
  rm -rf "$src"; mkdir -p "$src"
  log "kubernetes $v: reading k8s.io/kubernetes@$v go.mod"
  local gomod
  gomod="$(cd "$src" && go mod download -json "k8s.io/kubernetes@$v" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  local staging="v0.${v#v1.}"
  {
    echo "module $modname"
    echo
    echo "go 1.24.0"
    echo
    echo "require k8s.io/kubernetes $v"
    echo
    go mod edit -json "$gomod" | STAGING="$staging" python3 -c '
import json, os, sys
mod = json.load(sys.stdin)
staging = os.environ["STAGING"]
n = 0
for r in mod.get("Replace") or []:
    old, new = r["Old"]["Path"], r["New"]["Path"]
    if new.startswith("./staging/src/"):
        print(f"replace {old} => {old} {staging}")
        n += 1
    else:
        sys.exit(f"unexpected replace in k8s.io/kubernetes go.mod: {old} => {new}")
if n == 0:
    sys.exit("no staging replaces found in k8s.io/kubernetes go.mod")
'
  } >"$src/go.mod"
  log "kubernetes $v: $(grep -c '^replace' "$src/go.mod") staging modules replaced with $staging"
  log "kubernetes $v: resolving modules for $*"
  local p
  for p in "$@"; do (cd "$src" && go get "$p@$v"); done
}

kube_ldflags() { # <src dir>: the version stamp `--version` and /version report
  local v="$KUBERNETES_VERSION"
  local minor="${v#v1.}"; minor="${minor%%.*}"
  local commit
  commit="$(cd "$1" && go mod download -json "k8s.io/kubernetes@$v" | python3 -c 'import json,sys; print((json.load(sys.stdin).get("Origin") or {}).get("Hash",""))')"
  local date; date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
    [[ -n "$commit" ]] && ld+=" -X $pkg.gitCommit=$commit"
  done
  echo "$ld"
}

build_kube_apiserver() {
  local v="$KUBERNETES_VERSION"
  local out="$cache/bin/kube-apiserver-$v"
  if [[ -x "$out/kube-apiserver" ]]; then log "kube-apiserver $v: cached ($out/kube-apiserver)"; return; fi
  local src="$cache/src/kube-apiserver-$v"
  kube_wrapper "$src" forge.local/cluster/kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
  local ld; ld="$(kube_ldflags "$src")"
  log "kube-apiserver $v: compiling (the long pole: about 6 min on 2 idle cores the first time)"
  local tmp="$out.tmp.$$"; mkdir -p "$tmp"
  (cd "$src" && go build -p "$jobs" -ldflags "$ld" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
  "$tmp/kube-apiserver" --version >&2
  finish "$tmp" "$out"
  log "kube-apiserver $v: built $out/kube-apiserver"
}

# The node's components, from the same k8s.io/kubernetes release as kube-apiserver:
# bin/<name>-<version>/<name>. They share the Go build cache with kube-apiserver (most of
# k8s.io/{api,apimachinery,client-go,...} is compiled already). Missing ones are built together
# in one `go build` (one link step each), then each is installed atomically.
NODE_COMPONENTS=(kubelet kube-scheduler kube-controller-manager kube-proxy kubectl)

build_kube_node() {
  local v="$KUBERNETES_VERSION" missing=() name
  for name in "${NODE_COMPONENTS[@]}"; do
    if [[ -x "$cache/bin/$name-$v/$name" ]]; then log "$name $v: cached ($cache/bin/$name-$v/$name)"
    else missing+=("$name"); fi
  done
  [[ ${#missing[@]} -eq 0 ]] && return
  local src="$cache/src/kube-node-$v" pkgs=()
  for name in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
  kube_wrapper "$src" forge.local/cluster/kube-node "${pkgs[@]}"
  local ld; ld="$(kube_ldflags "$src")"
  log "kubernetes $v: compiling ${missing[*]}"
  local tmp="$cache/bin/.kube-node-$v.tmp.$$"; rm -rf "$tmp"; mkdir -p "$tmp"
  local t0=$SECONDS
  (cd "$src" && go build -p "$jobs" -ldflags "$ld" -o "$tmp/" "${pkgs[@]}")
  log "kubernetes $v: compiled ${missing[*]} in $((SECONDS - t0)) s"
  for name in "${missing[@]}"; do
    local one="$cache/bin/$name-$v.tmp.$$"; mkdir -p "$one"
    mv "$tmp/$name" "$one/$name"
    if [[ "$name" == kubectl ]]; then "$one/$name" version --client >&2; else "$one/$name" --version >&2; fi
    finish "$one" "$cache/bin/$name-$v"
    log "$name $v: built $cache/bin/$name-$v/$name"
  done
  rm -rf "$tmp"
}

# proxy_wrapper <name> <version> <module> <binary>...: the start of a build of <module>'s commands through a
# wrapper module, for the caller's locals: out=bin/<name>-<version>; when every <binary> is there already,
# log it and set cached=1; otherwise cached= , src=src/<name>-<version> (emptied) and gomod=the path of
# <module>@<version>'s go.mod, downloaded from the module proxy. A plain command (set -e stops a failed step).
proxy_wrapper() {
  local name="$1" v="$2" mod="$3" bin; shift 3
  out="$cache/bin/$name-$v" cached=1
  for bin in "$@"; do [[ -x "$out/$bin" ]] || cached=; done
  if [[ -n "$cached" ]]; then log "$name $v: cached ($out)"; return 0; fi
  src="$cache/src/$name-$v"
  rm -rf "$src"; mkdir -p "$src"
  gomod="$(cd "$src" && go mod download -json "$mod@$v" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
}

# A hard-linked copy of the verified module tree of $mod@$v at $src/<name>, to build in with upstream's own
# go.mod and go.sum (-mod=readonly); refused when that go.mod has replace directives (the caller's locals
# mod, v, src and gomod, from proxy_wrapper).
module_tree() {
  if grep -q '^replace' "$gomod"; then echo "$mod@$v go.mod has replace directives; check them before building" >&2; exit 1; fi
  local moddir; moddir="$(cd "$src" && go mod download -json "$mod@$v" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  cp -al "$moddir" "$src/$1"
}

# Argo Workflows' workflow-controller and argoexec (the executor that runs in every step's pod),
# ARGO_WORKFLOWS_VERSION from the module proxy: bin/argo-workflows-<version>/{workflow-controller,argoexec}.
# Its go.mod has no replace directives, so a wrapper module that requires it builds the commands
# with upstream's own requirements; ldflags as upstream's Makefile sets them.
build_argo() {
  local v="$ARGO_WORKFLOWS_VERSION" mod="$ARGO_WORKFLOWS_MODULE" out src gomod cached
  proxy_wrapper argo-workflows "$v" "$mod" workflow-controller argoexec
  [[ -z "$cached" ]] || return 0
  if grep -q '^replace' "$gomod"; then echo "$mod@$v go.mod has replace directives; the wrapper would ignore them" >&2; exit 1; fi
  local gover; gover="$(go mod edit -json "$gomod" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Go"])')"
  printf 'module forge.local/cluster/argo-workflows\n\ngo %s\n\nrequire %s %s\n' "$gover" "$mod" "$v" >"$src/go.mod"
  log "argo-workflows $v: resolving modules"
  (cd "$src" && go get "$mod/cmd/workflow-controller@$v" "$mod/cmd/argoexec@$v")
  local commit
  commit="$(cd "$src" && go mod download -json "$mod@$v" | python3 -c 'import json,sys; print((json.load(sys.stdin).get("Origin") or {}).get("Hash",""))')"
  local ld="-s -w -X $mod.version=$v -X $mod.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ) -X $mod.gitTreeState=clean -X $mod.gitTag=$v"
  [[ -n "$commit" ]] && ld+=" -X $mod.gitCommit=$commit"
  # Upstream's workflow/executor/osspecific/signal_linux.go is a git symlink to signal_darwin.go,
  # and module zips leave symlinks out: argoexec built from the proxy's zip fails with
  # "undefined: Setpgid" (go build -overlay may not touch GOMODCACHE). So the wrapper replaces the
  # module with a hard-linked copy of the same verified zip contents plus that one symlink, as in
  # upstream's tree.
  local moddir; moddir="$(cd "$src" && go list -m -f '{{.Dir}}' "$mod")"
  if [[ ! -e "$moddir/workflow/executor/osspecific/signal_linux.go" ]]; then
    cp -al "$moddir" "$src/upstream"
    chmod -R u+w "$src/upstream/workflow/executor/osspecific"
    ln -s signal_darwin.go "$src/upstream/workflow/executor/osspecific/signal_linux.go"
    (cd "$src" && go mod edit -replace "$mod=./upstream")
    log "argo-workflows $v: restored the symlink signal_linux.go -> signal_darwin.go (missing from the module zip) in a hard-linked copy"
  fi
  log "argo-workflows $v: compiling workflow-controller and argoexec"
  local tmp="$out.tmp.$$"; rm -rf "$tmp"; mkdir -p "$tmp"
  local t0=$SECONDS
  (cd "$src" && go build -p "$jobs" -ldflags "$ld" -o "$tmp/" "$mod/cmd/workflow-controller" "$mod/cmd/argoexec")
  log "argo-workflows $v: compiled in $((SECONDS - t0)) s"
  "$tmp/workflow-controller" version >&2 || true
  finish "$tmp" "$out"
  log "argo-workflows $v: built $out"
}

# The Prometheus Operator (cmd/operator) and its prometheus-config-reloader, PROMETHEUS_OPERATOR_VERSION
# from the module proxy: bin/prometheus-operator-<version>/{operator,prometheus-config-reloader}.
# Upstream's go.mod replaces its own pkg/apis/monitoring and pkg/client with ./pkg/..., which a
# requiring module ignores, so the wrapper requires the published submodules of the same tag (what
# those directories hold). ldflags as upstream's Makefile (GO_BUILD_LDFLAGS) sets them.
build_promop() {
  local v="$PROMETHEUS_OPERATOR_VERSION" mod="$PROMETHEUS_OPERATOR_MODULE" out src gomod cached
  proxy_wrapper prometheus-operator "$v" "$mod" operator prometheus-config-reloader
  [[ -z "$cached" ]] || return 0
  local gover; gover="$(go mod edit -json "$gomod" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Go"])')"
  # every replace must be one of its own submodules (./pkg/...), which the wrapper requires at $v
  go mod edit -json "$gomod" | MOD="$mod" python3 -c '
import json, os, sys
mod = os.environ["MOD"]
for r in json.load(sys.stdin).get("Replace") or []:
    old, new = r["Old"]["Path"], r["New"]["Path"]
    if not (new.startswith("./") and old == mod + new[1:]):
        sys.exit(f"unexpected replace in {mod} go.mod: {old} => {new}")
'
  printf 'module forge.local/cluster/prometheus-operator\n\ngo %s\n\nrequire (\n\t%s %s\n\t%s/pkg/apis/monitoring %s\n\t%s/pkg/client %s\n)\n' \
    "$gover" "$mod" "$v" "$mod" "$v" "$mod" "$v" >"$src/go.mod"
  log "prometheus-operator $v: resolving modules"
  (cd "$src" && go get "$mod/cmd/operator@$v" "$mod/cmd/prometheus-config-reloader@$v")
  local commit
  commit="$(cd "$src" && go mod download -json "$mod@$v" | python3 -c 'import json,sys; print((json.load(sys.stdin).get("Origin") or {}).get("Hash",""))')"
  local pc=github.com/prometheus/common/version
  local ld="-s -w -X $pc.Version=${v#v} -X $pc.Revision=$commit -X $pc.Branch=HEAD -X $pc.BuildUser=forge -X $pc.BuildDate=$(date -u +%Y%m%d-%H:%M:%S)"
  log "prometheus-operator $v: compiling operator and prometheus-config-reloader"
  local tmp="$out.tmp.$$"; rm -rf "$tmp"; mkdir -p "$tmp"
  local t0=$SECONDS
  (cd "$src" && go build -p "$jobs" -ldflags "$ld" -o "$tmp/operator" "$mod/cmd/operator")
  (cd "$src" && go build -p "$jobs" -ldflags "$ld" -o "$tmp/prometheus-config-reloader" "$mod/cmd/prometheus-config-reloader")
  log "prometheus-operator $v: compiled in $((SECONDS - t0)) s"
  "$tmp/operator" --version >&2 || true
  finish "$tmp" "$out"
  log "prometheus-operator $v: built $out"
}

# Prometheus itself, for the Prometheus the operator runs on the node: the version the pinned operator
# deploys by default (the last entry of PrometheusCompatibilityMatrix in its pkg/operator/defaults.go),
# module github.com/prometheus/prometheus v0.<major><minor:02>.<patch> (Prometheus tags its Go module
# v3.13.1 as v0.313.1). Built with upstream's build tags remove_all_sd + enable_kubernetes_sd (the only
# service discovery the operator's configs use) and without builtinassets (no web UI; the API is
# all the tests read): bin/prometheus-<version>/prometheus. Debian's prometheus (2.42) cannot stand in:
# Debian builds it without Kubernetes service discovery.
promop_prometheus_version() { # the operator's default Prometheus version, e.g. v3.13.1
  local opdir; opdir="$(go mod download -json "$PROMETHEUS_OPERATOR_MODULE@$PROMETHEUS_OPERATOR_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  python3 - "$opdir/pkg/operator/defaults.go" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
body = text.split("PrometheusCompatibilityMatrix = []string{", 1)[1].split("}", 1)[0]
print(re.findall(r'"(v[0-9.]+)"', body)[-1])
PY
}

build_prometheus() {
  local v; v="$(promop_prometheus_version)"
  local out="$cache/bin/prometheus-$v"
  if [[ -x "$out/prometheus" ]]; then log "prometheus $v: cached ($out/prometheus)"; return; fi
  local maj min pat; IFS=. read -r maj min pat <<<"${v#v}"
  local modv; modv="$(printf 'v0.%d%02d.%d' "$maj" "$min" "$pat")"
  local mod=github.com/prometheus/prometheus
  local src="$cache/src/prometheus-$v"
  rm -rf "$src"; mkdir -p "$src"
  local info; info="$(cd "$src" && go mod download -json "$mod@$modv")"
  local gomod; gomod="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])' <<<"$info")"
  local gover; gover="$(go mod edit -json "$gomod" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Go"])')"
  printf 'module forge.local/cluster/prometheus\n\ngo %s\n\nrequire %s %s\n' "$gover" "$mod" "$modv" >"$src/go.mod"
  log "prometheus $v ($mod $modv): resolving modules"
  (cd "$src" && go get "$mod/cmd/prometheus@$modv")
  local commit; commit="$(python3 -c 'import json,sys; print((json.load(sys.stdin).get("Origin") or {}).get("Hash",""))' <<<"$info")"
  local pc=github.com/prometheus/common/version
  local ld="-s -w -X $pc.Version=${v#v} -X $pc.Revision=$commit -X $pc.Branch=HEAD -X $pc.BuildUser=forge -X $pc.BuildDate=$(date -u +%Y%m%d-%H:%M:%S)"
  log "prometheus $v: compiling cmd/prometheus (tags remove_all_sd,enable_kubernetes_sd)"
  local tmp="$out.tmp.$$"; rm -rf "$tmp"; mkdir -p "$tmp"
  local t0=$SECONDS
  (cd "$src" && go build -p "$jobs" -tags remove_all_sd,enable_kubernetes_sd -ldflags "$ld" -o "$tmp/prometheus" "$mod/cmd/prometheus")
  log "prometheus $v: compiled in $((SECONDS - t0)) s"
  "$tmp/prometheus" --version >&2
  finish "$tmp" "$out"
  log "prometheus $v: built $out/prometheus"
}

# Traefik v3 (TRAEFIK_VERSION) from the module proxy: bin/traefik-<version>/traefik, upstream's
# `go build ./cmd/traefik` (its Makefile's binary target) in the module's own tree, so its go.mod, go.sum,
# replaces and excludes apply exactly as upstream builds it (-mod=readonly: every module checked against
# its go.sum). The tree is a hard-linked copy of the verified module contents; from v3.7 on, plus one thing
# module zips leave out: pkg/config/dynamic/ext is a nested module (github.com/traefik/traefik/dynamic/ext,
# the `replace ... => ./pkg/config/dynamic/ext` of v3.7's go.mod), which the proxy does not serve (403), so
# it is written as upstream's tree holds it (v3.7.x: two empty extension structs, checked by sha256 below;
# a release that needs more from it fails to compile). v3.6.12, the pin, has no such module. No web UI:
# webui/static is what the zip holds (upstream's `make generate-webui` builds it with Node), and the
# dashboard is off on the node anyway.
TRAEFIK_EXT_GO_SHA256=fdd9a8232809b310da14d1f2bc467d9d45dd3d0d9937fc2f3280b779b52861d1
build_traefik() {
  local v="$TRAEFIK_VERSION" mod="$TRAEFIK_MODULE" out src gomod cached
  proxy_wrapper traefik "$v" "$mod" traefik
  [[ -z "$cached" ]] || return 0
  # every replace: a published module version, or the nested ext module restored below
  go mod edit -json "$gomod" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    old, new = r["Old"]["Path"], r["New"]
    if new["Path"] == "./pkg/config/dynamic/ext" and old == "github.com/traefik/traefik/dynamic/ext":
        continue
    if not new.get("Version"):
        path = new["Path"]
        sys.exit(f"unexpected local replace in traefik go.mod: {old} => {path}")
'
  local moddir; moddir="$(cd "$src" && go mod download -json "$mod@$v" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  local gover; gover="$(go mod edit -json "$gomod" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Go"])')"
  cp -al "$moddir" "$src/traefik"
  local ext="$src/traefik/pkg/config/dynamic/ext"
  if grep -q '^replace github.com/traefik/traefik/dynamic/ext => ./pkg/config/dynamic/ext' "$gomod" && [[ ! -e "$ext/go.mod" ]]; then
    chmod u+w "$src/traefik/pkg/config/dynamic"
    mkdir -p "$ext"
    printf 'module github.com/traefik/traefik/dynamic/ext\n\ngo %s\n' "$gover" >"$ext/go.mod"
    printf 'package ext\n\n// HTTP is a dynamic.HTTP extension.\ntype HTTP struct{}\n\n// Router is a dynamic.Router extension.\ntype Router struct{}\n' >"$ext/ext.go"
    if [[ "$(sha256sum <"$ext/ext.go" | cut -c1-64)" != "$TRAEFIK_EXT_GO_SHA256" ]]; then
      echo "traefik $v: the written pkg/config/dynamic/ext/ext.go is not upstream's (sha256)" >&2; exit 1
    fi
    log "traefik $v: wrote the nested module pkg/config/dynamic/ext (missing from the module zip) as upstream's tree has it"
  fi
  local commit
  commit="$(cd "$src" && go mod download -json "$mod@$v" | python3 -c 'import json,sys; print((json.load(sys.stdin).get("Origin") or {}).get("Hash",""))')"
  local pv="$mod/pkg/version" codename
  codename="$(awk '$1 == "CODENAME" && $2 == "?=" {print $3; exit}' "$moddir/Makefile")"  # as its Makefile stamps it
  local ld="-s -w -X $pv.Version=$v -X $pv.Codename=${codename:-unknown} -X $pv.BuildDate=$(date -u '+%Y-%m-%d_%I:%M:%S%p')"
  log "traefik $v${commit:+ ($commit)}: compiling ./cmd/traefik (heavy: several minutes the first time)"
  local tmp="$out.tmp.$$"; rm -rf "$tmp"; mkdir -p "$tmp"
  local t0=$SECONDS
  (cd "$src/traefik" && go build -mod=readonly -p "$jobs" -ldflags "$ld" -o "$tmp/traefik" ./cmd/traefik)
  log "traefik $v: compiled in $((SECONDS - t0)) s"
  "$tmp/traefik" version >&2
  finish "$tmp" "$out"
  log "traefik $v: built $out/traefik"
}

# Kueue's manager (KUEUE_VERSION) from the module proxy: bin/kueue-<version>/kueue, upstream's
# `go build ./cmd/kueue` (its Makefile's build target, cmd/kueue/main.go) in the module's own tree, so its
# go.mod and go.sum apply exactly as upstream builds it (-mod=readonly); the tree is a hard-linked copy of the
# verified module contents. ldflags as upstream's Makefile (LD_FLAGS) stamps them. The manager has no
# --version flag: the check runs it with no cluster to reach and reads the version it logs first
# ("Initializing", gitVersion), before it exits for want of its metrics certificate or a kubeconfig.
# The proxy's .info for this module carries no Origin, so gitCommit is "unknown".
build_kueue() {
  local v="$KUEUE_VERSION" mod="$KUEUE_MODULE" out src gomod cached
  proxy_wrapper kueue "$v" "$mod" kueue
  [[ -z "$cached" ]] || return 0
  if grep -q '^replace' "$gomod"; then echo "$mod@$v go.mod has replace directives; check them before building" >&2; exit 1; fi
  local info; info="$(cd "$src" && go mod download -json "$mod@$v")"
  local moddir; moddir="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' <<<"$info")"
  local commit; commit="$(python3 -c 'import json,sys; print((json.load(sys.stdin).get("Origin") or {}).get("Hash",""))' <<<"$info")"
  cp -al "$moddir" "$src/kueue"
  local pv="$mod/pkg/version"
  local ld="-s -w -X $pv.GitVersion=$v -X $pv.GitCommit=${commit:-unknown} -X $pv.BuildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  log "kueue $v${commit:+ ($commit)}: compiling ./cmd/kueue (heavy: tens of minutes on 2 loaded cores the first time)"
  local tmp="$out.tmp.$$"; rm -rf "$tmp"; mkdir -p "$tmp"
  local t0=$SECONDS
  (cd "$src/kueue" && go build -mod=readonly -p "$jobs" -ldflags "$ld" -o "$tmp/kueue" ./cmd/kueue)
  log "kueue $v: compiled in $((SECONDS - t0)) s"
  local said; said="$(cd "$tmp" && KUBECONFIG="$tmp/no-kubeconfig" timeout 60 "$tmp/kueue" 2>&1 || true)"
  if ! grep -q "\"gitVersion\": *\"$v\"" <<<"$said"; then
    printf '%s\n' "$said" | head -20 >&2
    echo "kueue $v: the built manager does not report gitVersion $v" >&2; exit 1
  fi
  grep -m1 '"Initializing"' <<<"$said" >&2 || true
  finish "$tmp" "$out"
  log "kueue $v: built $out/kueue"
}

# The Kubeflow Training Operator's manager (TRAINING_OPERATOR_VERSION, the v1 line the judge already
# builds against) from the module proxy: bin/training-operator-<version>/training-operator, upstream's
# `go build ./cmd/training-operator.v1` (its Dockerfile's build) in the module's own tree, so its go.mod
# and go.sum apply exactly (-mod=readonly); the tree is a hard-linked copy of the verified module
# contents. v1.9 has no version flag: the check is that `--help` lists the flags the node starts it
# with (devkit/node/training_operator.py).
TRAINING_OPERATOR_FLAGS=(enable-scheme metrics-bind-address health-probe-bind-address webhook-server-port)
build_training_operator() {
  local v="$TRAINING_OPERATOR_VERSION" mod="$TRAINING_OPERATOR_MODULE" out src gomod cached
  proxy_wrapper training-operator "$v" "$mod" training-operator
  [[ -z "$cached" ]] || return 0
  module_tree training-operator
  log "training-operator $v: compiling ./cmd/training-operator.v1 (several minutes the first time)"
  local tmp="$out.tmp.$$"; rm -rf "$tmp"; mkdir -p "$tmp"
  local t0=$SECONDS
  (cd "$src/training-operator" && CGO_ENABLED=0 go build -mod=readonly -p "$jobs" -ldflags "-s -w" \
    -o "$tmp/training-operator" ./cmd/training-operator.v1)
  log "training-operator $v: compiled in $((SECONDS - t0)) s"
  local said flag; said="$("$tmp/training-operator" --help 2>&1 || true)"
  for flag in "${TRAINING_OPERATOR_FLAGS[@]}"; do
    if ! grep -q -- "-$flag" <<<"$said"; then
      printf '%s\n' "$said" | head -20 >&2
      echo "training-operator $v: the built manager has no --$flag" >&2; exit 1
    fi
  done
  finish "$tmp" "$out"
  log "training-operator $v: built $out/training-operator"
}

# CoreDNS (COREDNS_VERSION) from the module proxy: bin/coredns-<version>/coredns, upstream's Makefile target
# `coredns` (CGO_ENABLED=0 go build -tags=grpcnotrace -ldflags="-s -w -X .../coremain.GitCommit=...") in the
# module's own tree, so its go.mod and go.sum apply exactly as upstream builds it (-mod=readonly); the tree is
# a hard-linked copy of the verified module contents. The default plugin set: plugin.cfg as released, whose
# generated core/plugin/zplugin.go and core/dnsserver/zdirectives.go the module holds (the Makefile's `check`
# regenerates them only when plugin.cfg is newer). GitCommit is what the Makefile's `git describe --dirty
# --always` gives at a release tag: the tag. The check: `coredns -version` names the version, and `-plugins`
# lists the plugins the node's Corefile uses (devkit/node/coredns.py).
COREDNS_PLUGINS=(kubernetes forward cache health ready errors loop reload loadbalance prometheus)
build_coredns() {
  local v="$COREDNS_VERSION" mod="$COREDNS_MODULE" out src gomod cached
  proxy_wrapper coredns "$v" "$mod" coredns
  [[ -z "$cached" ]] || return 0
  module_tree coredns
  log "coredns $v: compiling (upstream's default plugin set, tags grpcnotrace)"
  local tmp="$out.tmp.$$"; rm -rf "$tmp"; mkdir -p "$tmp"
  local t0=$SECONDS
  (cd "$src/coredns" && go build -mod=readonly -p "$jobs" -tags grpcnotrace \
    -ldflags "-s -w -X $mod/coremain.GitCommit=$v" -o "$tmp/coredns")
  log "coredns $v: compiled in $((SECONDS - t0)) s"
  local said; said="$("$tmp/coredns" -version)"
  printf '%s\n' "$said" >&2
  if ! grep -q "^CoreDNS-${v#v}\$" <<<"$said"; then echo "coredns $v: the built binary does not report CoreDNS-${v#v}" >&2; exit 1; fi
  local plugins p; plugins="$("$tmp/coredns" -plugins)"
  for p in "${COREDNS_PLUGINS[@]}"; do
    if ! grep -qx "$p" <<<"$plugins"; then echo "coredns $v: plugin $p is not compiled in" >&2; exit 1; fi
  done
  finish "$tmp" "$out"
  log "coredns $v: built $out/coredns"
}

judges="$(cd "$here/../.." && pwd)/judges"

judge_key() {
  # Sources + the pins they must match + the toolchain: any change builds a new directory.
  # Folders with their own go.mod (judges/promop) are other modules: not part of the key.
  local nested=() d
  while IFS= read -r d; do nested+=(! -path "$d/*"); done < <(cd "$judges" && find . -mindepth 2 -name go.mod -printf '%h\n')
  {
    go_sources "$judges" "${nested[@]}"
    echo "ARGO_WORKFLOWS_VERSION=$ARGO_WORKFLOWS_VERSION TRAINING_OPERATOR_VERSION=$TRAINING_OPERATOR_VERSION"
    go env GOVERSION
  } | short_key 16
}

judge_out() { echo "$cache/bin/forge-judge-$(judge_key)"; }

build_judge() {
  local out; out="$(judge_out)"
  if [[ -x "$out/forge-judge" ]]; then log "forge-judge: cached ($out/forge-judge)"; return; fi
  # judges/go.mod is what gets compiled; versions.env is what the cluster installs. Refuse to
  # build a judge of another version than the CRDs the test cluster serves.
  local mod pin
  for pair in "$ARGO_WORKFLOWS_MODULE=$ARGO_WORKFLOWS_VERSION" "$TRAINING_OPERATOR_MODULE=$TRAINING_OPERATOR_VERSION"; do
    mod="${pair%%=*}"; pin="${pair#*=}"
    if ! grep -qE "^[[:space:]]*(require[[:space:]]+)?${mod//./\\.}[[:space:]]+${pin//./\\.}([[:space:]]|\$)" "$judges/go.mod"; then
      echo "judges/go.mod does not require $mod $pin (scripts/cluster/versions.env); update both together" >&2
      exit 1
    fi
  done
  log "forge-judge: compiling argo-workflows $ARGO_WORKFLOWS_VERSION + training-operator $TRAINING_OPERATOR_VERSION (a few minutes the first time)"
  local tmp="$out.tmp.$$"; mkdir -p "$tmp"
  (cd "$judges" && go build -mod=readonly -p "$jobs" -ldflags "-s -w" -o "$tmp/forge-judge" ./cmd/forge-judge)
  finish "$tmp" "$out"
  log "forge-judge: built $out/forge-judge"
}

# one build at a time (two test sessions starting together would share the source dirs)
mkdir -p "$cache/bin"
lock() { exec 9>"$cache/bin/.build.lock"; flock 9; }

what="${1:-all}"
case "$what" in
  etcd) lock; build_etcd ;;
  kube-apiserver) lock; build_kube_apiserver ;;
  node) lock; build_kube_node ;;
  argo) lock; build_argo ;;
  promop) lock; build_promop; build_prometheus ;;
  promop-prometheus-version) promop_prometheus_version ;;
  traefik) lock; build_traefik ;;
  kueue) lock; build_kueue ;;
  coredns) lock; build_coredns ;;
  training-operator) lock; build_training_operator ;;
  all) lock; build_etcd; build_kube_apiserver ;;
  judge)
    # A cached judge needs no lock: installs are atomic renames, and a kube-apiserver build
    # holding the lock for minutes must not stall every test that only asks for the path.
    if [[ ! -x "$(judge_out)/forge-judge" ]]; then lock; build_judge; fi
    echo "$(judge_out)/forge-judge" ;;
  *) echo "usage: $0 [etcd|kube-apiserver|all|node|argo|promop|promop-prometheus-version|traefik|kueue|coredns|training-operator|judge]" >&2; exit 2 ;;
esac
