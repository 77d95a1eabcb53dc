#!/usr/bin/env bash
# bench-vm.sh - softrdma against the Linux kernel's siw and rxe, all of it INSIDE one interop VM
# guest (../shared/interop-vm), each over the guest's own loopback: the same (emulated) CPUs,
# kernel and memory for both sides, nothing on the bridge.
#
# Boots the persistent VM 1 (interop.sh --start; a VM 1 already running is stopped first and the
# new one is stopped at the end), copies the softrdma binary into the guest through the 9p share
# (RUNDIR = /host), and runs, RUNS times each, interleaved (one of every measurement per round):
#
#   softrdma iWARP   softrdma perf --loopback --bw --op write -s SIZE -n BW_ITERS --json
#                    softrdma perf --loopback --lat --op send|write -s LAT_SIZE -n LAT_ITERS --json
#                    (iWARP over TCP on 127.0.0.1; the raw TCP baseline comes from the same run)
#   softrdma RoCE    the same with --transport roce --raw-tx P (127.0.0.1 <-> 127.0.0.2; raw UDP
#                    baselines from the same run). P: `required` if a raw-socket probe run works in
#                    the guest, else `off` (the UDP socket); the summary says which.
#   siw              ib_write_bw -d siw0 -R -F -s SIZE -n BW_ITERS     server, and client to SIW_IP
#                    ib_send_lat / ib_write_lat -d siw0 -R -F -s LAT_SIZE -n LAT_ITERS
#   rxe              ib_write_bw -d rxe0 -x 1 -F -s SIZE -n BW_ITERS   server, and client to GUEST_IP
#                    ib_send_lat / ib_write_lat -d rxe0 -x 1 -F -s LAT_SIZE -n LAT_ITERS
#   extras (--no-extra drops them): softrdma RoCE with the other --raw-tx path (off, if the main
#                    path is the raw socket), softrdma RoCE bandwidth with -m 1024 (rxe's active MTU
#                    at the guest's netdev MTU 1500; -n M1024_ITERS), and both latencies of both transports with
#                    --busy (perftest's latency tests busy-poll; softrdma's default is its hybrid
#                    poll-then-sleep wait), and rxe's Write bandwidth at active_mtu 4096 (eth0 set to
#                    MTU 9000 for that run, then back to 1500)
#
# Bandwidth: MB/s as both tools print it (MiB/s: perftest's "BW average[MB/sec]" and softrdma's
# mbyte_s both divide by 2^20). Latency: t_typical (the median; half a round trip for Send and
# Write in both tools), in microseconds. Each figure is the median of the RUNS runs; the ratios
# are softrdma / kernel (bandwidth: above 1 = softrdma faster; latency: above 1 = slower).
# A measurement that fails (non-zero exit, no figure, a figure of 0, perftest's "inf" when its
# TSC calibration fails under TCG) is retried up to TRIES times; retries are listed under "notes".
#
# The VM shares the host's CPUs: before each measurement the script waits (up to QUIET_WAIT s)
# until processes other than the VM's QEMU use less than QUIET_PCT % of one host CPU (1 s
# sample), and records that figure for the measurement itself (column host_other_cpu: busy CPU
# time of everything but QEMU during the measurement, in % of one CPU) so that runs disturbed
# by other host load can be told apart.
#
# The guest's net.core.rmem_max / wmem_max are raised to --rmem (default 4194304, 4 MiB): at
# the guest's default 212992 the raw UDP baseline's 4 MiB socket buffers (and softrdma RoCE's
# send buffer) are capped, the baseline's window overruns the receive buffer and it aborts
# ("datagrams lost"). --rmem 0 leaves the guest's defaults.
#
# Needs root and /dev/net/tun (the VM's network namespace and taps). Only one VM script at a
# time (they share VM 1). Under TCG on 2 host cores the default set takes about 15-20 minutes.
#
# Options: --runs N (default 5)  --size N (bandwidth, default 65536)  --bw-iters N (default 5000)
#          --lat-size N (default 2)  --lat-iters N (default 1000)  --tries N (default 5)
#          --m1024-iters N (the -m 1024 extra's -n, default 1000: about 5 MB/s under TCG)
#          --quiet-pct P (default 20)  --quiet-wait S (default 120; 0: do not wait)
#          --timeout S (per measurement, default 300)  --rmem BYTES (default 4194304; 0: leave)
#          --no-extra  --bin PATH (softrdma binary; default $SOFTRDMA_BIN or target/release/softrdma,
#          not built here)  --out DIR (default target/bench-vm)  -h
# Output in OUT: raw/ (each run's JSON, perftest client and server output, stderr), results.tsv
# (name, run, value, attempts, wall seconds, host_other_cpu), env.txt (guest and VM facts), summary.txt (the table).
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VMDIR=${INTEROP_VM_DIR:-$(dirname "$0")/../../shared/interop-vm}
VMDIR=$(cd "$VMDIR" && pwd)
STATE=${INTEROP_VM_STATE:-/var/tmp/interop-vm}
RUNS=5 SIZE=65536 BW_ITERS=5000 LAT_SIZE=2 LAT_ITERS=1000 TRIES=5 TIMEOUT=300 RMEM=4194304
M1024_ITERS=1000 QUIET_PCT=20 QUIET_WAIT=120
EXTRA=1 BIN=${SOFTRDMA_BIN:-$REPO/target/release/softrdma}
OUT=$REPO/target/bench-vm
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift ;;
    --size) SIZE=$2; shift ;;
    --bw-iters) BW_ITERS=$2; shift ;;
    --lat-size) LAT_SIZE=$2; shift ;;
    --lat-iters) LAT_ITERS=$2; shift ;;
    --tries) TRIES=$2; shift ;;
    --timeout) TIMEOUT=$2; shift ;;
    --rmem) RMEM=$2; shift ;;
    --m1024-iters) M1024_ITERS=$2; shift ;;
    --quiet-pct) QUIET_PCT=$2; shift ;;
    --quiet-wait) QUIET_WAIT=$2; shift ;;
    --no-extra) EXTRA=0 ;;
    --bin) BIN=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 0 ;;
    *) echo "bench-vm.sh: unknown argument $1 (see -h)" >&2; exit 2 ;;
  esac
  shift
done

[ "$(id -u)" = 0 ] || { echo "bench-vm.sh: needs root (network namespace, taps)" >&2; exit 2; }
[ -c /dev/net/tun ] || { echo "bench-vm.sh: needs /dev/net/tun" >&2; exit 2; }
[ -x "$BIN" ] || { echo "bench-vm.sh: no $BIN (cargo build --release -p softrdma-cli, or --bin)" >&2; exit 2; }
command -v jq >/dev/null || { echo "bench-vm.sh: needs jq" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/raw"; mkdir -p "$OUT/raw"
RES=$OUT/results.tsv
printf 'name\trun\tvalue\tattempts\twall_s\thost_other_cpu\n' > "$RES"
: > "$OUT/notes.txt"
# interop.sh --start writes its boot log under runs/ without creating it.
mkdir -p "$STATE/runs"

INTEROP=$VMDIR/interop.sh
# shellcheck source=/dev/null
. "$VMDIR/vmctl.sh"
GUEST_ROCE=10.77.0.2 GUEST_SIW=10.77.1.2
GIDX=1          # rxe0 GID index 1 = ::ffff:10.77.0.2
PORT=18515      # perftest's port (TCP OOB for rxe, rdma_cm for siw)
VMRUN=""

say() { echo "[bench-vm $(date +%T)] $*" >&2; }
note() { echo "$*" >> "$OUT/notes.txt"; say "note: $*"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# a figure: a positive number (perftest prints inf, or 0.00, when its clock calibration fails)
isnum() { [[ "$1" =~ ^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] && awk -v v="$1" 'BEGIN { exit !(v > 0) }'; }
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$RES"; }   # NAME RUN VALUE ATTEMPTS WALL HOST_OTHER

# Host CPU used by everything but the VM's QEMU: snapshot "busy-jiffies qemu-jiffies time".
HZ=$(getconf CLK_TCK)
cpu_snap() {
  local q b
  b=$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat)
  q=$(awk '{ print $14 + $15 }' "/proc/$(cat "$VMRUN/qemu.pid" 2>/dev/null)/stat" 2>/dev/null)
  echo "$b ${q:-0} $(now)"
}
other_cpu() {  # SNAP-BEFORE: % of one CPU used by non-QEMU processes since then
  local s1; s1=$(cpu_snap)
  awk -v a="$1" -v b="$s1" -v hz="$HZ" 'BEGIN { split(a, x, " "); split(b, y, " ");
    t = y[3] - x[3]; if (t <= 0) { print "-"; exit }
    o = ((y[1] - x[1]) - (y[2] - x[2])) / hz / t * 100; if (o < 0) o = 0; printf "%.1f\n", o }'
}
QUIET_WAITED=0
wait_quiet() {  # until the rest of the host is below QUIET_PCT (1 s samples), QUIET_WAIT s at most
  [ "$QUIET_WAIT" = 0 ] && return 0
  local end=$(( $(date +%s) + QUIET_WAIT )) s o t0; t0=$(now)
  while :; do
    s=$(cpu_snap); sleep 1; o=$(other_cpu "$s")
    awk -v o="$o" -v p="$QUIET_PCT" 'BEGIN { exit !(o < p) }' && break
    [ "$(date +%s)" -lt "$end" ] || { note "host still busy (${o}% of a CPU besides the VM) after ${QUIET_WAIT}s: measuring anyway"; break; }
  done
  QUIET_WAITED=$(awk -v a="$QUIET_WAITED" -v b="$(elapsed "$t0")" 'BEGIN { print a + b - 1 }')
}

start_vm() {
  "$INTEROP" --stop >/dev/null 2>&1
  say "booting the VM"
  "$INTEROP" --start >/dev/null || { say "VM boot failed"; return 1; }
  VMRUN=$("$INTEROP" --status | sed -n 's/^running: //p')
  [ -n "$VMRUN" ] || { say "no persistent VM after --start"; return 1; }
  say "VM up: $VMRUN"
}
trap '"$INTEROP" --stop >/dev/null 2>&1' EXIT

# --- softrdma: one run writes /host/bench/TAG.json (+ .err); FIELDS are "name=jq-path" pairs.
# sr NAME RUN "perf args" name=jqpath ...   (records one row per field, all from one run)
sr() {
  local name=$1 run=$2 args=$3; shift 3
  local a t0 w tag rc ok f fname path v snap other vals=()
  for a in $(seq "$TRIES"); do
    tag=$name-r$run-a$a
    wait_quiet
    snap=$(cpu_snap)
    t0=$(now)
    vm_exec "$VMRUN" "unset LD_PRELOAD; /tmp/softrdma perf --loopback $args --json >/host/bench/$tag.json 2>/host/bench/$tag.err" \
      "$TIMEOUT" >"$OUT/raw/$tag.exec" 2>&1
    rc=$?
    w=$(elapsed "$t0") other=$(other_cpu "$snap")
    mv "$VMRUN/bench/$tag.json" "$VMRUN/bench/$tag.err" "$OUT/raw/" 2>/dev/null
    [ -s "$OUT/raw/$tag.exec" ] || rm -f "$OUT/raw/$tag.exec"
    [ -s "$OUT/raw/$tag.err" ] || rm -f "$OUT/raw/$tag.err"
    ok=1 vals=()
    if [ $rc = 0 ]; then
      for f in "$@"; do
        path=${f#*=}
        v=$(jq -r "$path // empty" "$OUT/raw/$tag.json" 2>/dev/null)
        isnum "$v" || { ok=0; break; }
        vals+=("$v")
      done
    else ok=0; fi
    if [ $ok = 1 ]; then
      local i=0
      for f in "$@"; do fname=${f%%=*}; record "$fname" "$run" "${vals[$i]}" "$a" "$w" "$other"; i=$((i + 1)); done
      say "$name run $run: ${vals[*]} (${w}s, rest of host ${other}% CPU)"
      return 0
    fi
    note "$name run $run attempt $a failed (rc $rc): $(tail -n 1 "$OUT/raw/$tag.err" 2>/dev/null; tail -n 1 "$OUT/raw/$tag.exec" 2>/dev/null)"
  done
  for f in "$@"; do record "${f%%=*}" "$run" FAIL "$TRIES" "" ""; done
  return 1
}

# --- perftest: server job, wait until it listens, client; the figure from the client's result line.
# pt NAME RUN "server cmd" "client address" COLUMN (5th column: t_typical; 4th: BW average)
pt() {
  local name=$1 run=$2 cmd=$3 addr=$4 col=$5
  local a t0 w tag job rc src v snap other
  for a in $(seq "$TRIES"); do
    tag=$name-r$run-a$a
    wait_quiet
    job=$(vm_spawn "$VMRUN" "unset LD_PRELOAD; timeout $TIMEOUT $cmd" srv)
    vm_exec "$VMRUN" "vm-wait-listen $PORT 30" 40 >/dev/null 2>&1 || note "$tag: the server did not listen on $PORT"
    snap=$(cpu_snap) t0=$(now)
    vm_exec "$VMRUN" "unset LD_PRELOAD; timeout $TIMEOUT $cmd $addr" $((TIMEOUT + 10)) >"$OUT/raw/$tag.client.txt" 2>&1
    rc=$?
    w=$(elapsed "$t0") other=$(other_cpu "$snap")
    if ! vm_wait "$VMRUN" "$job" 30 quiet; then
      vm_kill "$VMRUN" "$job"
      vm_wait "$VMRUN" "$job" 10 quiet
    fi
    src=$(cat "$VMRUN/q/$job.rc" 2>/dev/null || echo killed)
    cp "$VMRUN/q/$job.out" "$OUT/raw/$tag.server.txt" 2>/dev/null
    # the result line: "<size> <iterations> <figures...>"
    v=$(awk -v s="$([ "$col" = 4 ] && echo "$SIZE" || echo "$LAT_SIZE")" -v c="$col" \
      '$1 == s && $2 ~ /^[0-9]+$/ && NF >= c { v = $c } END { print v }' "$OUT/raw/$tag.client.txt")
    if [ $rc = 0 ] && isnum "$v"; then
      [ "$src" = 0 ] || note "$tag: client ok, server exit status $src"
      record "$name" "$run" "$v" "$a" "$w" "$other"
      say "$name run $run: $v (${w}s, rest of host ${other}% CPU)"
      return 0
    fi
    note "$tag failed (client rc $rc, server $src, figure '${v}'): $(grep -m1 -iE '[[:space:]]inf[[:space:]]|error|fail|r\^2' "$OUT/raw/$tag.client.txt")"
  done
  record "$name" "$run" FAIL "$TRIES" "" ""
  return 1
}

# --- the set, one round
IW_BW="--bw --op write -s $SIZE -n $BW_ITERS"
lat() { echo "--lat --op $1 -s $LAT_SIZE -n $LAT_ITERS"; }
BWF='.bw[0].rdma.mbyte_s'
rxe_mtu() {  # NETDEV-MTU ACTIVE-MTU: set eth0's MTU, check rxe0's active_mtu follows
  vm_exec "$VMRUN" "ip link set eth0 mtu $1 && sleep 0.5 && ibv_devinfo -d rxe0 | grep -q 'active_mtu:[[:space:]]*$2 '" 30 >/dev/null 2>&1
}
round() {  # RUN
  local r=$1 op T
  # iWARP: softrdma, then siw
  sr sr-iw-bw "$r" "$IW_BW" sr_iw_write_bw="$BWF" raw_tcp_bw='.bw[0].raw_tcp.mbyte_s'
  for op in send write; do
    sr "sr-iw-lat-$op" "$r" "$(lat $op)" "sr_iw_${op}_lat=.lat[0].rdma.t_typical" \
      "raw_tcp_lat_beside_${op}=.lat[0].raw_tcp.t_typical"
  done
  pt siw_write_bw "$r" "ib_write_bw -d siw0 -R -F -s $SIZE -n $BW_ITERS" "$GUEST_SIW" 4
  pt siw_send_lat "$r" "ib_send_lat -d siw0 -R -F -s $LAT_SIZE -n $LAT_ITERS" "$GUEST_SIW" 5
  pt siw_write_lat "$r" "ib_write_lat -d siw0 -R -F -s $LAT_SIZE -n $LAT_ITERS" "$GUEST_SIW" 5
  # RoCE: softrdma, then rxe
  T="--transport roce --raw-tx $RAWTX"
  sr sr-roce-bw "$r" "$T $IW_BW" sr_roce_write_bw="$BWF" raw_udp_bw='.bw[0].raw_udp.mbyte_s' \
    raw_udp_gso_bw='.bw[0].raw_udp_gso.mbyte_s'
  for op in send write; do
    sr "sr-roce-lat-$op" "$r" "$T $(lat $op)" "sr_roce_${op}_lat=.lat[0].rdma.t_typical" \
      "raw_udp_lat_beside_${op}=.lat[0].raw_udp.t_typical"
  done
  pt rxe_write_bw "$r" "ib_write_bw -d rxe0 -x $GIDX -F -s $SIZE -n $BW_ITERS" "$GUEST_ROCE" 4
  pt rxe_send_lat "$r" "ib_send_lat -d rxe0 -x $GIDX -F -s $LAT_SIZE -n $LAT_ITERS" "$GUEST_ROCE" 5
  pt rxe_write_lat "$r" "ib_write_lat -d rxe0 -x $GIDX -F -s $LAT_SIZE -n $LAT_ITERS" "$GUEST_ROCE" 5
  [ "$EXTRA" = 1 ] || return 0
  # extras: the other --raw-tx path, -m 1024, --busy latencies
  T="--transport roce --raw-tx $ALT_RAWTX"
  sr sr-roce-alt-bw "$r" "$T $IW_BW" sr_roce_alt_write_bw="$BWF" \
    raw_udp_alt_bw='.bw[0].raw_udp.mbyte_s' raw_udp_gso_alt_bw='.bw[0].raw_udp_gso.mbyte_s'
  for op in send write; do
    sr "sr-roce-alt-lat-$op" "$r" "$T $(lat $op)" "sr_roce_alt_${op}_lat=.lat[0].rdma.t_typical"
  done
  sr sr-roce-m1024-bw "$r" "--transport roce --raw-tx $RAWTX -m 1024 --bw --op write -s $SIZE -n $M1024_ITERS" \
    sr_roce_m1024_write_bw="$BWF" raw_udp_m1024_bw='.bw[0].raw_udp.mbyte_s'
  # rxe at path MTU 4096: eth0 at MTU 9000 for this one run (loopback: nothing leaves the guest)
  if rxe_mtu 9000 4096; then
    pt rxe_m4096_write_bw "$r" "ib_write_bw -d rxe0 -x $GIDX -F -s $SIZE -n $BW_ITERS" "$GUEST_ROCE" 4
  else
    note "round $r: could not bring rxe0 to active_mtu 4096"; record rxe_m4096_write_bw "$r" FAIL 0 ""
  fi
  rxe_mtu 1500 1024 || note "round $r: rxe0 not back at active_mtu 1024"
  for op in send write; do
    sr "sr-iw-busy-lat-$op" "$r" "--busy $(lat $op)" "sr_iw_busy_${op}_lat=.lat[0].rdma.t_typical"
    sr "sr-roce-busy-lat-$op" "$r" "--transport roce --raw-tx $RAWTX --busy $(lat $op)" \
      "sr_roce_busy_${op}_lat=.lat[0].rdma.t_typical"
  done
}

# --- summary helpers
vals() { awk -F'\t' -v n="$1" -v c="${2:-3}" '$1 == n { printf "%s%s", s, $c; s = " " }' "$RES"; }
median() {  # NAME: median of the numeric values ("-" if none)
  awk -F'\t' -v n="$1" '$1 == n && $3 ~ /^[0-9.eE+-]+$/ { print $3 }' "$RES" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2];
      else printf "%.6g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.4f\n", a / b }'; }
row3() {  # LABEL SOFTRDMA-NAME KERNEL-NAME
  local a b; a=$(median "$2"); b=$(median "$3")
  printf '  %-36s %20s %12s %8s\n' "$1" "$a" "$b" "$(ratio "$a" "$b")"
}
row1() { printf '  %-36s %20s\n' "$1" "$(median "$2")"; }

summary() {
  local n
  {
    echo "bench-vm: $RUNS runs per figure, median; guest: $GUEST_FACTS"
    echo "bandwidth: -s $SIZE -n $BW_ITERS, MB/s (2^20 B/s); latency: -s $LAT_SIZE -n $LAT_ITERS, t_typical us"
    echo "softrdma RoCE main path: --raw-tx $RAWTX ($RAWTX_DESC); guest rmem_max/wmem_max: $RMEM_DESC"
    echo
    printf '  %-36s %20s %12s %8s\n' "iWARP" "softrdma" "siw" "sr/siw"
    row3 "RDMA Write BW (MB/s)" sr_iw_write_bw siw_write_bw
    row3 "Send latency ${LAT_SIZE} B (us)" sr_iw_send_lat siw_send_lat
    row3 "RDMA Write latency ${LAT_SIZE} B (us)" sr_iw_write_lat siw_write_lat
    row1 "raw TCP BW (MB/s)" raw_tcp_bw
    row1 "raw TCP lat, Send run (us)" raw_tcp_lat_beside_send
    row1 "raw TCP lat, Write run (us)" raw_tcp_lat_beside_write
    echo
    printf '  %-36s %20s %12s %8s\n' "RoCE (--raw-tx $RAWTX)" "softrdma" "rxe" "sr/rxe"
    row3 "RDMA Write BW (MB/s)" sr_roce_write_bw rxe_write_bw
    row3 "Send latency ${LAT_SIZE} B (us)" sr_roce_send_lat rxe_send_lat
    row3 "RDMA Write latency ${LAT_SIZE} B (us)" sr_roce_write_lat rxe_write_lat
    row1 "raw UDP BW (MB/s)" raw_udp_bw
    row1 "raw UDP GSO BW (MB/s)" raw_udp_gso_bw
    row1 "raw UDP lat, Send run (us)" raw_udp_lat_beside_send
    row1 "raw UDP lat, Write run (us)" raw_udp_lat_beside_write
    if [ "$EXTRA" = 1 ]; then
      echo
      printf '  %-36s %20s %12s %8s\n' "extras" "softrdma" "kernel" "ratio"
      row3 "RoCE --raw-tx $ALT_RAWTX Write BW" sr_roce_alt_write_bw rxe_write_bw
      row3 "RoCE --raw-tx $ALT_RAWTX Send lat" sr_roce_alt_send_lat rxe_send_lat
      row3 "RoCE --raw-tx $ALT_RAWTX Write lat" sr_roce_alt_write_lat rxe_write_lat
      row1 "  its raw UDP BW" raw_udp_alt_bw
      row1 "  its raw UDP GSO BW" raw_udp_gso_alt_bw
      row3 "RoCE -m 1024 Write BW (-n $M1024_ITERS)" sr_roce_m1024_write_bw rxe_write_bw
      row1 "  its raw UDP BW (1024 B dgrams)" raw_udp_m1024_bw
      row3 "RoCE Write BW vs rxe at MTU 4096" sr_roce_write_bw rxe_m4096_write_bw
      row3 "iWARP --busy Send lat" sr_iw_busy_send_lat siw_send_lat
      row3 "iWARP --busy Write lat" sr_iw_busy_write_lat siw_write_lat
      row3 "RoCE --busy Send lat" sr_roce_busy_send_lat rxe_send_lat
      row3 "RoCE --busy Write lat" sr_roce_busy_write_lat rxe_write_lat
    fi
    echo
    echo "per run:"
    for n in $(awk -F'\t' 'NR > 1 && !seen[$1]++ { print $1 }' "$RES"); do
      printf '  %-28s median %-20s [%s]  rest-of-host CPU %% [%s]\n' "$n" "$(median "$n")" "$(vals "$n")" "$(vals "$n" 6)"
    done
    if [ -s "$OUT/notes.txt" ]; then echo; echo "notes:"; sed 's/^/  /' "$OUT/notes.txt"; fi
    echo
    echo "waited for a quiet host: ${QUIET_WAITED}s in all; whole run: $(elapsed "$T_START") s"
    echo "raw results: $OUT/raw, $RES"
  } | tee "$OUT/summary.txt"
}

T_START=$(now)
start_vm || exit 1
# the binary, through the share, into the guest's tmpfs
mkdir -p "$VMRUN/bench"
cp "$BIN" "$VMRUN/softrdma" || exit 1
vm_exec "$VMRUN" 'cp /host/softrdma /tmp/softrdma && /tmp/softrdma --version' 60 >"$OUT/raw/copy.txt" 2>&1 ||
  { say "could not copy the binary into the guest: $(cat "$OUT/raw/copy.txt")"; exit 1; }
rm -f "$VMRUN/softrdma"

ACCEL=$(sed -n 's/.*-accel \([a-z]*\).*/\1/p' "$VMRUN/qemu.cmdline")
SMP=$(sed -n 's/.* -smp \([0-9]*\) .*/\1/p' "$VMRUN/qemu.cmdline")
vm_exec "$VMRUN" 'echo "kernel $(uname -r)"; echo "nproc $(nproc)"; grep -m1 "model name" /proc/cpuinfo;
  grep -m1 "cpu MHz" /proc/cpuinfo; free -m | sed -n 2p; rdma link show; ibv_devices;
  ibv_devinfo -d rxe0 | grep -E "active_mtu|max_mtu"; echo "rxe0 gid[1] $(cat /sys/class/infiniband/rxe0/ports/1/gids/1)";
  ip -br addr; sysctl net.core.rmem_max net.core.wmem_max' 60 >"$OUT/env.txt" 2>&1
{ echo "qemu accel: $ACCEL, -smp $SMP"; echo "host: $(nproc) cpus, $(uname -r)"; cat "$VMRUN/qemu.cmdline"; } >> "$OUT/env.txt"
GUEST_FACTS="qemu -accel $ACCEL, $(awk '/^nproc/ { print $2 }' "$OUT/env.txt") vCPUs ($(sed -n 's/^model name[[:space:]]*: //p' "$OUT/env.txt")), kernel $(awk '/^kernel/ { print $2 }' "$OUT/env.txt")"
say "guest: $GUEST_FACTS"

RMEM_DESC="guest default"
if [ "$RMEM" != 0 ]; then
  vm_exec "$VMRUN" "sysctl -w net.core.rmem_max=$RMEM net.core.wmem_max=$RMEM" 20 >>"$OUT/env.txt" 2>&1 &&
    RMEM_DESC="set to $RMEM" || note "could not set net.core.rmem_max/wmem_max in the guest"
fi

# which RoCE transmit path: a raw socket if the guest lets us open one (it runs as root)
if vm_exec "$VMRUN" "unset LD_PRELOAD; /tmp/softrdma perf --loopback --transport roce --raw-tx required --lat --op send -s 2 -n 20" 120 \
    >"$OUT/raw/rawtx-probe.txt" 2>&1; then
  RAWTX=required ALT_RAWTX=off RAWTX_DESC="raw socket available: raw IPv4 socket transmit"
else
  RAWTX=off ALT_RAWTX=auto RAWTX_DESC="no raw socket in the guest (see raw/rawtx-probe.txt): UDP socket"
  note "--raw-tx required failed in the guest; RoCE runs with --raw-tx off"
fi
say "RoCE transmit path: --raw-tx $RAWTX ($RAWTX_DESC)"

for r in $(seq "$RUNS"); do
  say "=== round $r of $RUNS"
  round "$r"
done
say "all rounds done in $(elapsed "$T_START") s"
summary
