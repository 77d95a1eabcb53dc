#!/usr/bin/env bash
# callgrind-write.sh - user-space instructions per 64 KiB RDMA Write, both transports
# (issue 12, Done-when 7): `softrdma perf --loopback --bw --op write` under callgrind with
# N1 and N2 messages; (Ir(N2) - Ir(N1)) / (N2 - N1) is what one more Write costs in this
# process, both ends together (client, server, progress threads), set-up cancelled out. The
# raw baseline runs N messages too; its share is printed apart (the inclusive cost of its
# functions) and taken out. Kernel work (system calls, TCP, UDP) is not counted by
# callgrind. Compare a change against docs/performance.md with the same command.
#
#   scripts/callgrind-write.sh [--size BYTES] [--n1 N] [--n2 N] [--no-build]
#   SOFTRDMA_BIN=path/to/softrdma scripts/callgrind-write.sh --no-build   # another build
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=65536 N1=200 N2=1200 BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --size) SIZE=$2; shift ;;
    --n1) N1=$2; shift ;;
    --n2) N2=$2; shift ;;
    --no-build) BUILD=0 ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 0 ;;
    *) echo "callgrind-write.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$BUILD" = 1 ] && cargo build --release -p softrdma-cli >&2
BIN=${SOFTRDMA_BIN:-target/release/softrdma}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# total instructions, and the raw baseline's (its client and server functions, inclusive)
measure() {  # NAME N ARGS...
  local name=$1 n=$2; shift 2
  valgrind --tool=callgrind --callgrind-out-file="$OUT/$name-$n" \
    "$BIN" perf --loopback --bw --op write -s "$SIZE" -n "$n" "$@" >/dev/null 2>"$OUT/$name-$n.log"
  local total raw
  total=$(callgrind_annotate "$OUT/$name-$n" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  raw=$(callgrind_annotate --inclusive=yes --threshold=100 "$OUT/$name-$n" 2>/dev/null \
    | grep -E 'crates/cli/src/perf/[a-z]+\.rs:softrdma_cli::perf::(tcp::bw|raw::serve|udp::UdpBaseline::bw_of|udp::udp_serve) ' \
    | awk '{gsub(",", "", $1); match($0, /softrdma_cli::perf::[A-Za-z_:]+/); f = substr($0, RSTART, RLENGTH); if (!(f in seen)) { seen[f] = 1; s += $1 } } END {print s + 0}' || true)
  echo "$total $raw"
}
printf '%-34s %16s %16s %14s\n' "transport" "Ir per Write" "baseline share" "per octet"
for t in "iwarp" "roce --raw-tx off" "roce --raw-tx off --no-gso"; do
  name=$(echo "$t" | tr ' ' '_')
  read -r a ra < <(measure "$name" "$N1" --transport $t)
  read -r b rb < <(measure "$name" "$N2" --transport $t)
  per=$(( (b - a) / (N2 - N1) ))
  base=$(( (rb - ra) / (N2 - N1) ))
  printf '%-34s %16d %16d %14.2f\n' "$t" "$((per - base))" "$base" "$(echo "($per - $base) / $SIZE" | bc -l)"
done
