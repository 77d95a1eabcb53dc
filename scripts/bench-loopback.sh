#!/usr/bin/env bash
# bench-loopback.sh - the data-path figures of issue 12: `softrdma perf --loopback` RUNS times
# (default 5) per configuration, each run beside its raw baseline, and the median of every
# ratio (the machine is shared and noisy: runs interleave the configurations).
#
#   iWARP, 64 KiB and 1 MiB: blocking, --busy, --crc   (ratio to one raw TCP stream)
#   RoCE, 64 KiB, path MTU 4096 and 1024, UDP-socket path with GSO/GRO (--raw-tx off) and
#   the raw-socket path (ratios to per-datagram raw UDP and to raw UDP with GSO)
#
#   scripts/bench-loopback.sh [--runs N] [--seconds S] [--only iwarp|roce] [--out DIR] [--no-build]
#                             [--base BIN]
# --base BIN also runs every configuration with another build (say, main's), interleaved
# with this one's runs; its rows are the `base:` ones: before and after in one run.
# Raw JSON per run in DIR (default target/bench-loopback); the medians on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=5 SECS=1 ONLY="" OUT=target/bench-loopback BUILD=1 BASE=
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift ;;
    --seconds) SECS=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-build) BUILD=0 ;;
    --base) BASE=$2; shift ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 0 ;;
    *) echo "bench-loopback.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
. scripts/bench-lib.sh
bench_prepare
CONFIGS=()
if [ "$ONLY" != roce ]; then
  for s in 65536 1048576; do
    CONFIGS+=("iwarp-$s-block|--transport iwarp -s $s" "iwarp-$s-busy|--transport iwarp -s $s --busy" "iwarp-$s-crc|--transport iwarp -s $s --crc")
  done
fi
if [ "$ONLY" != iwarp ]; then
  for m in 4096 1024; do
    CONFIGS+=("roce-65536-mtu$m-udp|--transport roce -s 65536 -m $m --raw-tx off" "roce-65536-mtu$m-raw|--transport roce -s 65536 -m $m --raw-tx required")
  done
fi
bench_runs --bw -D "$SECS"
PYTHONPATH=scripts python3 - "$OUT" <<'PY'
import statistics, sys
from bench_json import runs
print(f"{'configuration':<33} {'test':<12} {'runs':>4} {'Gb/s':>8} {'raw':>8} {'ratio':>6} {'min':>6} {'max':>6} {'GSO':>8} {'r_gso':>6}")
for name, reports in runs(sys.argv[1]):
    rows = {}
    for v in reports:
        for b in v["bw"]:
            base = b.get("raw_tcp") or b.get("raw_udp")
            g = b.get("raw_udp_gso")
            rows.setdefault(b["test"], []).append((b["rdma"]["gbit_s"], base["gbit_s"], b["ratio"],
                                                  g["gbit_s"] if g else 0.0, b.get("ratio_gso") or 0.0))
    for t, r in rows.items():
        med = lambda k: statistics.median(x[k] for x in r)
        print(f"{name:<33} {t:<12} {len(r):>4} {med(0):>8.2f} {med(1):>8.2f} {med(2):>6.2f} "
              f"{min(x[2] for x in r):>6.2f} {max(x[2] for x in r):>6.2f} {med(3):>8.2f} {med(4):>6.2f}")
PY
