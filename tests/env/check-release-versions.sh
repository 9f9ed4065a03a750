#!/usr/bin/env bash
# Checks that one version names a release: the workspace's crates (Cargo.toml), and both charts' version and
# appVersion. With an argument (the release workflow passes its tag without the "v"), that version too, and a
# section for it in CHANGELOG.md, whose text becomes the release notes.
#
# Usage: tests/env/check-release-versions.sh [VERSION]
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "release versions: $*" >&2; exit 1; }

crates="$(awk '/^\[workspace.package\]/ { inside = 1; next } /^\[/ { inside = 0 }
  inside && $1 == "version" { gsub(/"/, "", $3); print $3; exit }' Cargo.toml)"
[ -n "$crates" ] || fail "no version in Cargo.toml's [workspace.package]"
for chart in gha-runner-scale-set-controller gha-runner-scale-set; do
  file="charts/$chart/Chart.yaml"
  version="$(sed -n 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$file")"
  app="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$file")"
  [ "$version" = "$crates" ] || fail "$file: version $version, the crates are $crates"
  [ "$app" = "$crates" ] || fail "$file: appVersion $app, the crates are $crates"
  grep -q '^  arc-rs.io/released: "false"$' "$file" ||
    fail "$file: the annotation arc-rs.io/released must say \"false\" in the repository (the release workflow sets it)"
done
if [ $# -gt 0 ]; then
  [ "$1" = "$crates" ] || fail "the tag says $1, the crates and charts $crates"
  grep -q "^## $1\b" CHANGELOG.md || fail "CHANGELOG.md has no section \"## $1\""
fi
echo "release versions: $crates everywhere"
