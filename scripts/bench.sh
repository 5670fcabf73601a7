#!/usr/bin/env bash
# Every figure of docs/performance.md, measured here and now, as one table.
#
#   scripts/bench.sh full    # release build, the documented workloads (minutes)
#   scripts/bench.sh quick   # small workloads on the test build (seconds; what a test runs)
#
# The benchmarks are the ignored tests of tests/bench/; each prints its
# figures as FIGURE|name|value|detail lines, which this script collects.
# Needs the PostgreSQL server binaries and GNU time (/usr/bin/time), as the
# test suite does.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-full}
case "$mode" in
  full) profile=(--release); export TEND_BENCH=full ;;
  quick) profile=(); export TEND_BENCH=quick ;;
  *) echo "usage: scripts/bench.sh [full|quick]" >&2; exit 2 ;;
esac

if [ "$mode" = full ]; then
  cargo build --release --all-targets >&2
  # What is measured is what ships: a release build never has the test
  # hooks compiled in (build.rs), though --all-targets turns the feature on.
  if target/release/tend --version | grep -q test-hooks; then
    echo "scripts/bench.sh: target/release/tend has the test hooks compiled in; it must not" >&2
    exit 1
  fi
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# One benchmark at a time: they share the machine's two cores.
if ! cargo nextest run "${profile[@]}" --run-ignored only --no-capture \
    --test-threads 1 \
    --test bench >"$log" 2>&1; then
  cat "$log" >&2
  echo "scripts/bench.sh: a benchmark failed (output above)" >&2
  exit 1
fi

commit=$(git rev-parse --short=12 HEAD)
dirty=$(git status --porcelain --untracked-files=no | head -1)
machine="$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
echo "tend benchmarks ($mode), commit $commit${dirty:+ with uncommitted changes}, $(date -u +%Y-%m-%d), $machine"
echo
echo "| figure | value | how |"
echo "| --- | --- | --- |"
grep -a '^FIGURE|' "$log" | while IFS='|' read -r _ key value detail; do
  echo "| $key | $value | $detail |"
done
count=$(grep -ac '^FIGURE|' "$log")
if [ "$count" -eq 0 ]; then
  echo "scripts/bench.sh: no figures were printed" >&2
  exit 1
fi
