#!/usr/bin/env bash
# The container runtime of the real-node test tier (docs/development.md, "Test tiers"): containerd, runc and
# the CNI plugins, from the distribution's packages. kubelet and kube-scheduler come from
# tests/env/provision.sh with the rest of the control plane.
#
# Installs what is missing when it runs as root (Debian/Ubuntu: apt-get). Never starts a daemon: each test
# node runs its own containerd with its own root, state, socket and config.
#
# Exit status:
#   0  every part is there (or was installed); the node tier can run.
#   3  parts are missing and this script cannot install them (not root, or no apt-get): it prints what to
#      install, and the node tier is skipped, loudly.
#   1  anything else, and any missing part when CI=true: CI must run the node tier, so a missing part fails.
#
# Usage: tests/env/provision-node.sh
set -euo pipefail

readonly STATUS_SKIP=3
readonly PACKAGES=(containerd runc containernetworking-plugins)
# Where Debian's containernetworking-plugins puts the plugins; the harness looks in the same places
# (tests/harness/src/node/prerequisites.rs).
readonly CNI_DIRS=(/usr/lib/cni /opt/cni/bin)

log() { printf '[provision-node] %s\n' "$*" >&2; }

cni_dir() {
  local d
  for d in "${CNI_DIRS[@]}"; do
    if [ -x "$d/bridge" ] && [ -x "$d/loopback" ] && [ -x "$d/host-local" ]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}

# Prints the package of each missing part, one per line.
missing_packages() {
  command -v containerd >/dev/null && command -v ctr >/dev/null || echo containerd
  command -v runc >/dev/null || echo runc
  cni_dir >/dev/null || echo containernetworking-plugins
}

skip_or_fail() {
  if [ "${CI:-}" = true ]; then
    log "error: CI=true: the node tier must run in CI, so this fails the run"
    exit 1
  fi
  exit "$STATUS_SKIP"
}

mapfile -t missing < <(missing_packages)
if [ "${#missing[@]}" -eq 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    cat >&2 <<EOF
[provision-node] ************************************************************************
[provision-node] containerd, runc and the CNI plugins are installed, but the real-node test tier
[provision-node] runs a kubelet and containerd, which need root: run it as root.
[provision-node] ************************************************************************
EOF
    skip_or_fail
  fi
  log "ready: containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'), CNI plugins in $(cni_dir)"
  exit 0
fi

install_cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  log "installing ${missing[*]} from the distribution's packages"
  export DEBIAN_FRONTEND=noninteractive
  # A fresh machine has no package lists yet; update once only when the install cannot find a package.
  if ! apt-get install -y --no-install-recommends "${missing[@]}" >&2; then
    apt-get update >&2
    apt-get install -y --no-install-recommends "${missing[@]}" >&2
  fi
  mapfile -t missing < <(missing_packages)
  if [ "${#missing[@]}" -eq 0 ]; then
    log "ready: installed; CNI plugins in $(cni_dir)"
    exit 0
  fi
  log "error: still missing after the install: ${missing[*]}"
  exit 1
fi

cat >&2 <<EOF
[provision-node] ************************************************************************
[provision-node] The real-node test tier needs: ${missing[*]}
[provision-node] Install them as root, e.g. on Debian/Ubuntu:
[provision-node]     sudo $install_cmd
[provision-node] and run the node tier as root (the kubelet and containerd need it).
[provision-node] ************************************************************************
EOF
skip_or_fail
