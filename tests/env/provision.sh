#!/usr/bin/env bash
# Builds the upstream binaries the tests run against, from their Go modules, at pinned versions:
# kube-apiserver, kube-controller-manager, kube-scheduler and kubelet (k8s.io/kubernetes), etcd
# (go.etcd.io/etcd/server/v3), helm (helm.sh/helm/v3) and actionlint (github.com/rhysd/actionlint), which checks
# the release workflows. They land in a cache outside the repository and are
# reused when present. kubelet and kube-scheduler serve the real-node tier (docs/development.md); the node's
# runtime (containerd, runc, CNI plugins) comes from the distribution: tests/env/provision-node.sh.
#
# Usage: tests/env/provision.sh [--print-dir]
#   Prints the assets directory (envtest's KUBEBUILDER_ASSETS convention) on its last line.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
# The linter of the release workflows (.github/workflows), from the Go module proxy.
ACTIONLINT_VERSION="${ACTIONLINT_VERSION:-v1.7.12}"

cache_root="${ARC_RS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/arc-rs}"
assets="$cache_root/k8s-$K8S_VERSION"
bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet etcd helm actionlint)
# actionlint is rebuilt when its version's stamp is missing.
actionlint_stamp="actionlint-$ACTIONLINT_VERSION.version"
# helm is rebuilt when this stamp is missing: a helm built without the release's Kubernetes version flags
# renders every chart as if for Kubernetes v1.20.
helm_stamp="helm-$HELM_VERSION.release-flags"

log() { printf '[provision] %s\n' "$*" >&2; }

have_all() {
  local b
  for b in "${bins[@]}"; do [ -x "$assets/$b" ] || return 1; done
  [ -f "$assets/$helm_stamp" ] && [ -f "$assets/$actionlint_stamp" ]
}

if have_all; then
  echo "$assets"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed; it is needed once to build the control plane"; exit 1; }
mkdir -p "$assets"
# Several test binaries may provision at once; one builds, the others wait and reuse.
exec 9>"$assets/.lock"
flock 9
if have_all; then echo "$assets"; exit 0; fi

work="$(mktemp -d "${TMPDIR:-/tmp}/arc-rs-provision.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
if [ "${CI:-}" = true ] && [ -z "${ARC_RS_KEEP_GO_CACHE:-}" ]; then
  # CI builds these once and keeps only the binaries: Go's build and module caches for Kubernetes (about 5 GB)
  # would only take the disk the tests need. ARC_RS_KEEP_GO_CACHE=1 keeps Go's usual caches.
  export GOCACHE="$work/go-build" GOMODCACHE="$work/go-mod"
  trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
fi

build_k8s() {
  local b missing=0
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do [ -x "$assets/$b" ] || missing=1; done
  [ "$missing" = 0 ] && return 0
  log "building kube-apiserver, kube-controller-manager, kube-scheduler and kubelet $K8S_VERSION (cold: ~12-25 min on 2 cores)"
  local dir="$work/k8s" minor staging_version
  mkdir -p "$dir"
  # k8s.io/kubernetes replaces its staging modules with ./staging paths; a consumer must pin each of
  # them to the published v0.X.Y that matches v1.X.Y.
  staging_version="v0.${K8S_VERSION#v1.}"
  minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  curl -fsSL "${GOPROXY_URL:-https://proxy.golang.org}/k8s.io/kubernetes/@v/$K8S_VERSION.mod" -o "$dir/upstream.mod"
  {
    echo "module arc-rs/provision/k8s"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    grep -oE 'k8s.io/[a-z0-9-]+ => \./staging' "$dir/upstream.mod" | awk '{print $1}' | while read -r m; do
      # Modules k8s never publishes (e.g. sample-cli-plugin) are not in the build graph.
      if go list -m "$m@$staging_version" >/dev/null 2>&1; then
        echo "	$m => $m $staging_version"
      fi
    done
    echo ")"
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools
GO
  local ldflags="-s -w"
  ldflags+=" -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$dir" && go get "k8s.io/kubernetes@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" >&2 \
    && go build -trimpath -ldflags "$ldflags" -o "$dir/out/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet >&2)
  mv "$dir/out/kube-apiserver" "$dir/out/kube-controller-manager" "$dir/out/kube-scheduler" \
    "$dir/out/kubelet" "$assets/"
}

build_etcd() {
  [ -x "$assets/etcd" ] && return 0
  log "building etcd $ETCD_VERSION"
  local dir="$work/etcd"
  mkdir -p "$dir"
  # etcd's own main module carries replace directives, so `go install` cannot build it; this
  # two-line main calls the server's entry point, exactly what etcd's main.go does.
  cat >"$dir/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  printf 'module arc-rs/provision/etcd\n\ngo 1.26\n' >"$dir/go.mod"
  (cd "$dir" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2 && go mod tidy >&2 \
    && go build -trimpath -ldflags "-s -w" -o "$dir/etcd" . >&2)
  mv "$dir/etcd" "$assets/etcd"
}

build_helm() {
  [ -x "$assets/helm" ] && [ -f "$assets/$helm_stamp" ] && return 0
  log "building helm $HELM_VERSION"
  # The released helm links the Kubernetes version of its client-go (major 1, minor = client-go's minor) as
  # the default .Capabilities.KubeVersion; without it `helm template` assumes v1.20 and charts branching on
  # the version render their pre-1.29 layout. Read client-go's version from helm's own go.mod.
  local gomod client_go k8s_minor ldflags
  gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
  client_go="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$gomod")"
  [ -n "$client_go" ] || { log "cannot read k8s.io/client-go's version from helm's go.mod ($gomod)"; exit 1; }
  k8s_minor="$(echo "$client_go" | cut -d. -f2)"
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1"
  ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor"
  ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1"
  ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor"
  GOBIN="$work/helm-bin" go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  mv "$work/helm-bin/helm" "$assets/helm"
  touch "$assets/$helm_stamp"
}

build_actionlint() {
  [ -x "$assets/actionlint" ] && [ -f "$assets/$actionlint_stamp" ] && return 0
  log "building actionlint $ACTIONLINT_VERSION"
  GOBIN="$work/actionlint-bin" go install -trimpath -ldflags "-s -w" \
    "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" >&2
  mv "$work/actionlint-bin/actionlint" "$assets/actionlint"
  touch "$assets/$actionlint_stamp"
}

build_etcd
build_helm
build_actionlint
build_k8s

have_all || { log "provisioning did not produce every binary in $assets"; exit 1; }
log "ready: $assets"
echo "$assets"
