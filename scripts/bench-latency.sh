#!/usr/bin/env bash
# bench-latency.sh - the latency guard (issue 42): `softrdma perf --loopback --lat` RUNS times
# (default 10) per cell, each run beside its raw ping-pong (same process, same size), and per
# cell the median and the worst run of softrdma / raw (t_typical; Send and Write as half
# round trips against the raw half round trip, Read as a round trip against the raw round
# trip). Cells: Send, Write and Read; 2 and 64 octets; waits blocking (the default), busy
# (--busy) and sleeping at once (--busy-poll-us 0); iWARP and RoCE. The "after-bw" cells run
# the latency tests the way the README's main job does: after the bandwidth tests, in one
# process (`perf --loopback` with its defaults).
#
#   scripts/bench-latency.sh [--runs N] [--iters N] [--only iwarp|roce] [--out DIR] [--no-build]
#                            [--base BIN]
#
# --base BIN also runs every cell with another build (say, main's), interleaved with this
# one's runs, and prints its rows beside (`base:` cells): before and after in one run.
# Runs interleave the configurations (the machine is shared and noisy). Raw JSON per run in
# DIR (default target/bench-latency); the table on stdout. A benchmark: it asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=10 ITERS=1000 ONLY="" OUT=target/bench-latency BUILD=1 BASE=
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift ;;
    --iters) ITERS=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-build) BUILD=0 ;;
    --base) BASE=$2; shift ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 0 ;;
    *) echo "bench-latency.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
. scripts/bench-lib.sh
bench_prepare
CONFIGS=()
for t in iwarp roce; do
  [ -n "$ONLY" ] && [ "$ONLY" != "$t" ] && continue
  for s in 2 64; do
    CONFIGS+=("$t-$s-block|--transport $t -s $s --lat -n $ITERS"
              "$t-$s-busy|--transport $t -s $s --lat --busy -n $ITERS"
              "$t-$s-poll0|--transport $t -s $s --lat --busy-poll-us 0 -n $ITERS")
  done
  # The README's main job: every test with its defaults (bandwidth 64 KiB, latency 64 B).
  CONFIGS+=("$t-64-after-bw|--transport $t")
done
bench_runs
PYTHONPATH=scripts python3 - "$OUT" <<'PY'
import statistics, sys
from bench_json import runs
print(f"{'cell':<27} {'test':<10} {'runs':>4} {'t_typ':>8} {'raw':>8} {'median':>7} {'worst':>7}")
for name, reports in runs(sys.argv[1]):
    rows = {}
    for v in reports:
        for r in v.get("lat") or []:
            base = r.get("raw_tcp") or r.get("raw_udp")
            rows.setdefault(r["test"], []).append((r["rdma"]["t_typical"], base["t_typical"], r["ratio"]))
    for t, r in sorted(rows.items()):
        med = lambda k: statistics.median(x[k] for x in r)
        print(f"{name:<27} {t:<10} {len(r):>4} {med(0):>8.2f} {med(1):>8.2f} {med(2):>7.2f} {max(x[2] for x in r):>7.2f}")
PY
