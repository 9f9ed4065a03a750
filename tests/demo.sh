#!/usr/bin/env bash
# The local demo: provisions the control-plane binaries if needed (cached after the first run), then runs one
# runner scale set end to end on this machine: control plane, fake Actions Service, manager, real listener,
# simulated runners. Arguments go to the demo binary (e.g. --jobs 200 --json); see docs/demo.md.
set -euo pipefail
cd "$(dirname "$0")/.."
KUBEBUILDER_ASSETS="$(tests/env/provision.sh | tail -n 1)"
export KUBEBUILDER_ASSETS

# Build only what the demo runs: the demo binary (the manager, the fake Actions Service and the runner simulator
# run inside it) and the listener binary it starts for each listener pod; with --real-node also what its images
# are made of. Left to itself the demo would ask cargo for every test target of the workspace. Cargo's own
# progress shows here.
build=(-p e2e --bin demo -p listener --bin listener)
what="the demo and the listener binaries"
for arg in "$@"; do
  if [ "$arg" = "--real-node" ]; then
    # On a real node the images are made of this build's binaries as well (tests/e2e/src/node_world.rs): the
    # project image holds the manager and the listener, beside a pause image and the stand-in runner.
    build+=(-p controller --bin manager -p node-images --bin arc-rs-pause --bin arc-rs-runner)
    what="the demo, listener, manager, pause and runner binaries"
  fi
done
echo "[demo] building $what (debug; the first build takes several minutes)" >&2
cargo build --locked "${build[@]}"
target_dir="$(cargo metadata --locked --no-deps --format-version 1 |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
# The demo takes the listener from here instead of building it (tests/harness/src/binaries.rs).
export ARC_RS_BIN_DIR="$target_dir/debug"
exec "$ARC_RS_BIN_DIR/demo" "$@"
