#!/usr/bin/env bash
# Runs every check and test of the project, as CI does: provisions the control-plane binaries (built once
# from their Go modules, then cached), then formatting, lints, and all tests against the real control plane and
# the fake Actions Service. Nothing outside the repository is needed. When ARC's reference data sits beside the
# repository (../shared, not part of it), the CRD compatibility check against ARC 0.14.2 and ARC master runs as well, and the
# chart tests also render ARC's own values files; without it both say they were skipped.
#
# Usage: tests/run.sh [extra cargo test args...]
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
# Free space where the run writes (the target directory, the temp directory of every control plane and node, the
# cache of provisioned binaries): a test that fails for want of disk then says how much there was.
disk() {
  local target="${CARGO_TARGET_DIR:-target}"
  mkdir -p "$target"
  local paths=() path
  # A fresh machine may have no cache directory yet (provisioning makes it): df fails on a missing path, and under
  # `set -o pipefail` that would end the run before its first step.
  for path in "$target" "${TMPDIR:-/tmp}" "${XDG_CACHE_HOME:-$HOME/.cache}"; do
    [ -e "$path" ] && paths+=("$path")
  done
  echo "disk ($1):"
  df -hP "${paths[@]}" | awk 'NR == 1 || !seen[$1]++'
}

if [ "${CI:-}" = true ]; then
  # CI builds once, in a fresh clone: incremental compilation's caches (several GB for this workspace) would only
  # be written, never read.
  export CARGO_INCREMENTAL=0
fi

disk "at the start"

step "control-plane binaries (tests/env/provision.sh)"
KUBEBUILDER_ASSETS="$(tests/env/provision.sh | tail -n 1)"
export KUBEBUILDER_ASSETS
echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"

step "real-node runtime (tests/env/provision-node.sh)"
# containerd, runc and the CNI plugins for the real-node tier. Status 3: parts are missing and cannot be
# installed here (not root); the tier's tests then skip with a loud message, and the run ends with status 3, not
# "all checks passed". With CI=true the script fails instead, and so does this run.
node_status=0
tests/env/provision-node.sh || node_status=$?
case "$node_status" in
  0) ;;
  3) echo "SKIPPED: the real-node tier will be skipped (see the message above)" >&2 ;;
  *) exit "$node_status" ;;
esac

step "release workflows (actionlint) and versions"
# The release itself runs only on GitHub (a registry, signing); here its workflow is linted, and one version must
# name the crates and both charts (the charts' packaging and NOTES are checked by tests/charts/tests/release.rs).
"$KUBEBUILDER_ASSETS/actionlint" .github/workflows/*.yml
tests/env/check-release-versions.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# `--all-targets` leaves out the suites marked `test = false` (they run in the waiting lane below): name them.
cargo clippy --workspace --locked --test real_node --test served --test bench -- -D warnings

step "cargo test"
# Two lanes at once. The suites that mostly wait (the real-node tier and the harness's own node tests, which
# take turns on one node, the served-condition suite, and the CI benchmark, which counts and waits for bursts)
# are left out of `cargo test --workspace` (`test = false` in their crates) and run beside it; one after the
# other they would add about 18 minutes to the run.
# Everything is built first, so the two lanes only run tests. --no-fail-fast: one run shows every failing test
# binary, not just the first.
cargo test --workspace --locked --no-run
# Four tests at a time in each test binary, not one per core: the control-plane suites mostly wait (a condition
# to appear, a quiet period to pass with nothing written: `bad_input`'s 26 tests took 152 s in pairs, 8 s of each
# a deliberate wait), so twice the tests side by side cut the lanes' time while the two cores stay the bound.
# The suites that measure take turns inside their binary (`bench`'s lock, the real-node tier's one node).
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
# The waiting lane names its test targets (`real_node` is in two crates) but still selects the whole workspace,
# so cargo resolves features exactly as for the lane above and reuses its build (a narrower `-p` selection
# would rebuild dependencies).
waiting_lane=(cargo test --workspace --locked --no-fail-fast --test real_node --test served --test bench)
"${waiting_lane[@]}" --no-run
disk "after the build"
waiting_log="$(mktemp)"
"${waiting_lane[@]}" "$@" >"$waiting_log" 2>&1 &
waiting_pid=$!
tests=0
cargo test --workspace --locked --no-fail-fast "$@" || tests=1
# The end-to-end scale-set suite once more with github.com's direct job assignment (jobs arrive assigned, nothing
# is acquired); above it ran GHES's acquire flow but for the tests that ask for direct assignment themselves. It
# runs in this lane, beside the waiting one, which takes longer (the real-node tier slows down under this lane's
# load): after both it added its 3 minutes to every run.
step "cargo test: the end-to-end scale-set suite with direct job assignment"
direct=0
E2E_JOB_DELIVERY=direct cargo test --workspace --locked --no-fail-fast --test scale_set "$@" || direct=1
waiting=0
wait "$waiting_pid" || waiting=1
step "cargo test: the waiting lane (real-node tier, served conditions, the CI benchmark)"
cat "$waiting_log"
rm -f "$waiting_log"
disk "after the tests"
if [ "$tests" != 0 ] || [ "$waiting" != 0 ] || [ "$direct" != 0 ]; then
  echo "error: tests failed (workspace lane: $tests, waiting lane: $waiting, direct assignment: $direct; 0 = passed)" >&2
  exit 1
fi

step "CRD compatibility with ARC 0.14.2 and ARC master (optional: needs ../shared)"
# The project's own CRD checks (crds/tests: schema rules, serde round trips, the generated files) ran above.
if [ -d ../shared ]; then
  crd_compat="../shared/tools/crd-compat"
  if [ ! -x "$crd_compat" ]; then
    echo "error: ../shared exists but $crd_compat is not an executable" >&2
    exit 1
  fi
  # The accepted differences, each with its reason (docs/migrating-from-arc.md, "What differs in the CRDs").
  "$crd_compat" --allow tests/crd-compat-allow.txt charts/gha-runner-scale-set-controller/crds
else
  echo "skipped: ../shared (ARC's reference data and tools) is not beside the repository; the project's own CRD tests ran"
fi

if [ "$node_status" = 3 ]; then
  # A skipped tier is not a pass: say so, and fail, so no summary reads green without it.
  step "NOT all checks ran: the real-node tier was skipped (see above); every other check passed"
  exit 3
fi
step "all checks passed"
