#!/usr/bin/env bash
# The local demo: provisions the control-plane binaries if needed (cached after the first run), then runs one
# runner scale set end to end on this machine: control plane, fake Actions Service, manager, real listener,
# simulated runners. Arguments go to the demo binary (e.g. --jobs 200 --json); see docs/demo.md.
set -euo pipefail
cd "$(dirname "$0")/.."
KUBEBUILDER_ASSETS="$(tests/env/provision.sh | tail -n 1)"
export KUBEBUILDER_ASSETS
exec cargo run --locked -p e2e --bin demo -- "$@"
