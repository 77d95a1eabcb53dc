#!/usr/bin/env bash
# interop-rxe.sh - softrdma (RoCEv2) against the Linux kernel's rxe (Soft-RoCE).
#
# Builds `softrdma` (release) and runs interop cases through ../shared/interop-vm/interop.sh on
# one persistent VM: the guest (10.77.0.2 = rxe0, GID index 1 = ::ffff:10.77.0.2) runs the
# rdma-core pingpongs and perftest, the host side (namespace rdmavm, 10.77.0.1) runs softrdma.
# The exchanges and rxe's quirks are described in docs/rxe-interop.md.
#
#   {rc,uc}_pingpong-s<size>-guest-server   guest ibv_*_pingpong server  vs  softrdma pingpong client
#   {rc,uc}_pingpong-s<size>-host-server    softrdma pingpong server     vs  guest ibv_*_pingpong client
#   ud_pingpong-s<size>-{guest,host}-server the same for UD (sizes 1..1024: rxe's port MTU)
#   rc_pingpong-s4096-own-pcap              our client's own --pcap capture decodes strictly and
#                                           holds what the bridge saw; --counters add up
#   ib_{write,read,atomic}_bw-guest-server  guest ib_*_bw (TCP OOB, no -R)  vs  softrdma perf client
#   rping-{c,s}-S<size>                     the IB CM on QP1 (librdmacm's rping, sizes 23 26 64 4096 65535,
#                                           -C 10 -V): softrdma rping -c vs guest rping -s, and the
#                                           reverse; the client's DREQ must reach the server
#   ib_{write,read,send}_bw-R-host-server   guest ib_*_bw -R (rdma_cm)  vs  softrdma perf --server --perftest
#   ib_{write,read,send}_bw-R-guest-server  guest ib_*_bw -R server  vs  softrdma perf --perftest -R HOST
#   udaddy-{guest,host}-server              UD through SIDR: guest udaddy vs softrdma udaddy, both roles
#   cm-reject-{host,guest}-client           a connect to a port nobody listens on: REJ "invalid service
#                                           ID" (reason 8) back within a second, both directions
#   cm-lossy-{host,guest}-client            --cm-loss % loss (default 5) both ways: 20 rping connects in
#                                           a row (MAD retries) each set up and verified, both roles
#   lossy-rc_pingpong-..., lossy-ib_*_bw-guest-server
#                                           the RC pingpong and perftest cases with loss (see --loss): netem on the
#                                           guest's egress, and an nft drop rule for host -> guest
#                                           (needs `apt-get install nftables` on the host; the kernel
#                                           has nf_tables built in even where it lacks sch_netem)
#
# The C ABI cases (issue 43): the host side is an unmodified Debian program run on softrdma through
# `softrdma run` (libsoftrdma_capi.so as libibverbs/librdmacm), on the RoCE device of 10.77.0.1
# (softrdma_roce_<ifname>, its GID index, both read from `softrdma run -- ibv_devinfo -v`):
#   capi-rping-c-S<size>                    host rping -c (--transport roce)  vs  guest rping -s
#                                           (--capi-rping-sizes, -C 10 -V: the client checks every pong)
#   capi-rping-s-S<size>                    guest rping -c -V  vs  host rping -s (--transport roce)
#   capi-{rc,ud}_pingpong-s<size>-guest-server  guest ibv_*_pingpong server  vs  host ibv_*_pingpong
#                                           client (QPs brought up out of band, -c: the server checks)
#   capi-{rc,ud}_pingpong-s<size>-host-server   host ibv_*_pingpong server  vs  guest client
#   capi-ib_write_bw-{guest,host}-server    perftest's own TCP exchange (no -R), both roles
#   capi-udaddy-{guest,host}-server         UD through rdma_cm (SIDR), host udaddy (--transport roce)
#   capi-lossy-rc_pingpong-s4096-guest-server   guest server vs host client at --loss % both ways
#
# Every case runs with -c (validate): the pingpong client zeroes byte 0 of each 4 KiB page, the
# server checks those bytes and prints "invalid data in page N" (its exit status stays 0, so
# the output is checked). Each case's bridge capture is decoded with `softrdma decode --strict`,
# whole and cut at 128 octets a frame as `tcpdump -s 128` takes it (with editcap).
# Prints PASS/FAIL/SKIP per case and a summary; exits 0 only if every case passed. A case whose
# softrdma subcommand does not exist yet is SKIPped (and the run does not count as passed).
# Needs root and /dev/net/tun (the VM's network namespace and taps).
#
# Options: --sizes "100 4096"  --ud-sizes "1 100 1024"  --count N (pingpong -n, default 100)
#          --perf-size N (default 65536)  --perf-count N (default 100)  --loss PCT (default 2)
#          --perf-more-sizes "2 4097 1048576" (the Write, Read and Send perftest cases again at
#                              these sizes, named ...-s<size>; not under loss)
#          --rping-sizes "23 26 64 4096 65535"  --rping-count N (default 10)  --cm-loss PCT (default 5)
#          --cm-connects N (default 20)  --no-cm
#          --no-perftest  --no-lossy  --no-build  --only REGEX (case names)
#          --no-capi (the C ABI cases)  --capi-rping-sizes "64 4096 65535"
#          --timeout S (per case; default 120, perftest 240, lossy 300)
#          --guest-selfcheck   run only the guest command lines against themselves inside the
#                              guest (server and client both on rxe0; no softrdma needed)
#          --out DIR (logs and pcaps; default target/interop-rxe)
# Environment: SOFTRDMA_BIN (default target/release/softrdma; --no-build implied if set)
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VMDIR=${INTEROP_VM_DIR:-$(dirname "$0")/../../shared/interop-vm}
VMDIR=$(cd "$VMDIR" && pwd)
# only_capture_gaps (the rest of it is redefined below, as this script keeps its own books).
. "$REPO/scripts/interop-lib.sh"
STATE=${INTEROP_VM_STATE:-/var/tmp/interop-vm}
SIZES="100 4096"
# ibv_ud_pingpong refuses -s above the port's active MTU (1024 at netdev MTU 1500); 1 is allowed.
UD_SIZES="1 100 1024"
COUNT=100
PERF_SIZE=65536 PERF_COUNT=100
# The smallest message, one over a page, 1 MiB (multi-packet at every path MTU).
PERF_MORE_SIZES="2 4097 1048576"
LOSS=2
PP_TIMEOUT=120 LOSSY_TIMEOUT=300 PERF_TIMEOUT=240
PERFTEST=1 LOSSY=1 BUILD_BIN=1 SELFCHECK=0 ONLY=""
CM=1 CM_LOSS=5 RPING_SIZES="23 26 64 4096 65535" RPING_COUNT=10 CM_CONNECTS=20
CAPI=1 CAPI_RPING_SIZES="64 4096 65535"
OUT=$REPO/target/interop-rxe
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) SIZES=$2; shift ;;
    --ud-sizes) UD_SIZES=$2; shift ;;
    --count) COUNT=$2; shift ;;
    --perf-size) PERF_SIZE=$2; shift ;;
    --perf-more-sizes) PERF_MORE_SIZES=$2; shift ;;
    --perf-count) PERF_COUNT=$2; shift ;;
    --loss) LOSS=$2; shift ;;
    --timeout) PP_TIMEOUT=$2; LOSSY_TIMEOUT=$2; PERF_TIMEOUT=$2; shift ;;
    --no-perftest) PERFTEST=0 ;;
    --no-cm) CM=0 ;;
    --cm-loss) CM_LOSS=$2; shift ;;
    --cm-connects) CM_CONNECTS=$2; shift ;;
    --rping-sizes) RPING_SIZES=$2; shift ;;
    --rping-count) RPING_COUNT=$2; shift ;;
    --no-lossy) LOSSY=0 ;;
    --no-capi) CAPI=0 ;;
    --capi-rping-sizes) CAPI_RPING_SIZES=$2; shift ;;
    --no-build) BUILD_BIN=0 ;;
    --only) ONLY=$2; shift ;;
    --guest-selfcheck) SELFCHECK=1 ;;
    --out) OUT=$2; shift ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 0 ;;
    *) echo "interop-rxe.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

[ "$(id -u)" = 0 ] || { echo "interop-rxe.sh: needs root (network namespace, taps)" >&2; exit 2; }
[ -c /dev/net/tun ] || { echo "interop-rxe.sh: needs /dev/net/tun" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=${SOFTRDMA_BIN:-$REPO/target/release/softrdma}
if [ "$SELFCHECK" = 0 ]; then
  if [ "$BUILD_BIN" = 1 ] && [ -z "${SOFTRDMA_BIN:-}" ]; then
    # softrdma-capi: libsoftrdma_capi.so beside the binary, where `softrdma run` finds it
    (cd "$REPO" && cargo build --release -p softrdma-cli -p softrdma-capi) || exit 1
  fi
  [ -x "$BIN" ] || { echo "interop-rxe.sh: no $BIN" >&2; exit 2; }
fi
# interop.sh --start writes its boot log under runs/ without creating it.
mkdir -p "$STATE/runs"

INTEROP=$VMDIR/interop.sh
# vm_exec / vm_spawn / vm_wait for the loss setup and --guest-selfcheck (functions only).
# shellcheck source=/dev/null
. "$VMDIR/vmctl.sh"
NS=${NETNS:-rdmavm}
GUEST_ROCE=10.77.0.2 HOST_ROCE=10.77.0.1
GIDX=1          # rxe0 GID index 1 = ::ffff:10.77.0.2 (index 0 is the IPv6 link-local GID)
OOB_PORT=18515
RESULTS=() NOTES=()
PASSED=0 FAILED=0 SKIPPED=0

say() { echo "[interop-rxe $(date +%T)] $*" >&2; }

# record NAME pass|fail|skip REASON
record() {
  case "$2" in
    pass) RESULTS+=("PASS  $1"); PASSED=$((PASSED + 1)); echo "PASS  $1" ;;
    skip) RESULTS+=("SKIP  $1: $3"); SKIPPED=$((SKIPPED + 1)); echo "SKIP  $1: $3" ;;
    *) RESULTS+=("FAIL  $1: $3"); FAILED=$((FAILED + 1)); echo "FAIL  $1: $3" ;;
  esac
}

selected() { [ -z "$ONLY" ] || [[ "$1" =~ $ONLY ]]; }

# section LOG guest|host: that side's output in an interop.sh log
section() {
  awk -v want="=== $2 " 'index($0, "=== ") == 1 { on = (index($0, want) == 1); next } on' "$1"
}

# decode_check NAME PCAP CASE-LOG: softrdma decode --strict of the case's capture. Under TCG
# tcpdump on the bridge can drop packets of bulk transfers ("dropped by kernel"); RoCEv2
# datagrams decode one by one, but the TCP OOB stream then has holes, which is only a note.
decode_check() {
  local log=$OUT/$1.decode dropped
  if "$BIN" decode --strict "$2" >"$log" 2>&1; then
    say "$1: decode --strict ok ($(tail -1 "$log"))"
    if ! snaplen_check "$2" "$OUT/$1"; then
      say "$1: cut at 128 octets a frame, decode --strict failed, see $OUT/$1.s128.decode"
      return 1
    fi
    return 0
  fi
  dropped=$(case_drops "$3")
  if only_capture_gaps "$log" "$dropped"; then
    say "$1: decode --strict: capture incomplete (tcpdump dropped $dropped packets): $(tail -1 "$log")"
    NOTES+=("$1: capture incomplete (tcpdump dropped $dropped packets), decode saw only TCP gaps")
    return 0
  fi
  say "$1: decode --strict failed, see $log"
  return 1
}

# run_case NAME CHECK_FN interop.sh-args...: one interop.sh case, its log, its verdict
run_case() {
  local name=$1 check=$2; shift 2
  selected "$name" || return 0
  local log=$OUT/$name.log pcap=$OUT/$name.pcap
  say "case $name"
  "$INTEROP" --attach --pcap "$pcap" "$@" >"$log" 2>&1
  local rc=$? why=""
  if [ $rc != 0 ]; then
    why="interop.sh exit $rc ($(grep -m1 -E '^=== interop' "$log" || echo 'no result line'))"
  else
    why=$("$check" "$log" 2>&1) || { [ -n "$why" ] || why="check $check failed"; }
  fi
  if [ -z "$why" ] && ! decode_check "$name" "$pcap" "$log"; then
    why="decode --strict of $pcap failed"
  fi
  if [ -z "$why" ]; then record "$name" pass ""; else record "$name" fail "$why (log $log)"; fi
}

# ---- command lines ------------------------------------------------------------------------
# The guest tools: exactly what docs/rxe-interop.md describes (-g 1, -m 1024 for RC/UC).
pp_mtu() { [ "$1" = ud ] || echo "-m 1024"; }              # ibv_ud_pingpong has no -m
guest_pp() {  # TYPE SIZE [SERVER]: an ibv_*_pingpong command line (client if SERVER is given)
  echo "ibv_$1_pingpong -d rxe0 -g $GIDX -p $OOB_PORT -s $2 -n $COUNT -c $(pp_mtu "$1") ${3:-}"
}
# softrdma pingpong (crates/cli/src/pingpong.rs), rdma-core's flags:
#   softrdma pingpong --rc|--uc|--ud [-p port] [-s size] [-n iters] [-g gid-index] [-m mtu]
#                     [-r rx-depth] [-c] [-e] [--bind ip] [--roce-port 4791] [host]
# Our RoCE address (GID ::ffff:10.77.0.1) is the local address of the TCP exchange; -g is
# accepted and does not change it.
host_pp() {  # TYPE SIZE [SERVER]
  echo "$BIN pingpong --$1 -p $OOB_PORT -g $GIDX -s $2 -n $COUNT -c $(pp_mtu "$1") ${3:-}"
}
guest_perf() {  # TEST [SERVER]: ib_{write,read,atomic}_bw with its own TCP OOB (no -R)
  local sz="-s $PERF_SIZE"
  [ "$1" = atomic ] && sz="-A FETCH_AND_ADD"                # atomics are always 8 bytes
  echo "ib_$1_bw -d rxe0 -x $GIDX -p $OOB_PORT -F -n $PERF_COUNT $sz ${2:-}"
}
# softrdma perf --transport roce --perftest (crates/cli/src/perf/perftest_client.rs): the client
# of a perftest server over perftest 6.06's TCP exchange (version, sys data, MTU, 108-byte
# records, bw report, "done"); RoCE from the TCP connection's local address, UDP 4791. -x is
# accepted (the GID is that address); -m defaults to 1024, then the smaller of both sides.
host_perf() {  # TEST
  local sz="-s $PERF_SIZE"
  [ "$1" = atomic ] && sz=""
  echo "$BIN perf --transport roce --perftest --test $1 -p $OOB_PORT -x $GIDX -n $PERF_COUNT $sz $GUEST_ROCE"
}

# ---- checks: print a reason and fail, or print nothing -------------------------------------
# The pingpongs print "N iters in S seconds = U usec/iter" at the end; the softrdma pingpong is
# expected to print the same line (its output format is an assumption of this script).
check_pp_side() {  # LOG guest|host WHO
  local out n
  out=$(section "$1" "$2")
  n=$(grep -cE "^$COUNT iters in " <<<"$out" || true)
  [ "$n" = 1 ] || { echo "$3 did not finish $COUNT iterations"; return 1; }
  if grep -q "invalid data in page" <<<"$out"; then
    echo "$3 found invalid data: $(grep -m1 'invalid data in page' <<<"$out")"; return 1
  fi
}
check_pp() {  # both sides finished; the guest saw our GID
  check_pp_side "$1" guest "guest ibv_*_pingpong" || return 1
  check_pp_side "$1" host "softrdma pingpong" || return 1
  section "$1" guest | grep -q "remote address: .*GID ::ffff:$HOST_ROCE" ||
    { echo "the guest did not get GID ::ffff:$HOST_ROCE from us"; return 1; }
}
check_perf() {  # the guest server prints the report the client sent (xchg_bw_reports)
  local size=$PERF_SIZE
  [[ "$1" == *ib_atomic_bw* ]] && size=8
  section "$1" guest | grep -qE "^[[:space:]]*${size}[[:space:]]+${PERF_COUNT}[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+" ||
    { echo "the guest perftest server printed no '$size $PERF_COUNT ...' result line"; return 1; }
}

# The connection manager (IB CM on QP1, librdmacm on top).
count_in() { section "$1" "$2" | grep -cE "$3" || true; }
check_rping_c() {  # our client verified every ping; our DREQ reached the guest's server
  local n; n=$(count_in "$1" host '^ping data: rdma-ping-')
  [ "$n" = "$RPING_COUNT" ] || { echo "softrdma client printed $n of $RPING_COUNT pings"; return 1; }
  section "$1" host | grep -q "client: $RPING_COUNT pings, $RPING_COUNT verified" ||
    { echo "softrdma client did not verify $RPING_COUNT pings"; return 1; }
  section "$1" guest | grep -q "server DISCONNECT EVENT" || { echo "the guest server saw no disconnect"; return 1; }
}
check_rping_s() {  # the guest client's -V passed; we read and checked every ping; its DREQ reached us
  local g s; g=$(count_in "$1" guest '^ping data: rdma-ping-'); s=$(count_in "$1" host '^server ping data: rdma-ping-')
  [ "$g" = "$RPING_COUNT" ] || { echo "guest rping client printed $g of $RPING_COUNT pings"; return 1; }
  [ "$s" = "$RPING_COUNT" ] || { echo "softrdma server printed $s of $RPING_COUNT pings"; return 1; }
  section "$1" host | grep -q "server: $RPING_COUNT pings, $RPING_COUNT verified" ||
    { echo "softrdma server did not verify $RPING_COUNT pings"; return 1; }
  section "$1" host | grep -q "server DISCONNECT EVENT" || { echo "softrdma server saw no disconnect"; return 1; }
}
check_perftest_r() {  # the guest's perftest printed its result line; our server saw the session
  section "$1" guest | grep -qE '^ *[0-9]+[[:space:]]+[0-9]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+' ||
    { echo "no perftest result line"; return 1; }
  section "$1" host | grep -q "perftest session done" || { echo "softrdma perf --perftest did not finish its session"; return 1; }
}
R_SIZE=65536
check_perftest_r_client() {  # both printed a result line for R_SIZE octets x 200
  local side
  for side in guest host; do
    section "$1" $side | grep -qE "^ *$R_SIZE[[:space:]]+200[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+" ||
      { echo "no result line for $R_SIZE octets from the $side"; return 1; }
  done
}
check_udaddy() {  # both sides moved their messages
  local side
  for side in guest host; do
    section "$1" $side | grep -q "data transfers complete" || { echo "$side udaddy did not complete"; return 1; }
    section "$1" $side | grep -q "return status 0" || { echo "$side udaddy failed"; return 1; }
  done
}
check_reject_host() {  # our client got REJ reason 8 within a second
  local ms
  section "$1" host | grep -q "reason 8" || { echo "softrdma client was not rejected with reason 8"; return 1; }
  ms=$(section "$1" host | sed -n 's/^elapsed_ms \([0-9]*\).*/\1/p')
  [ -n "$ms" ] && [ "$ms" -lt 1000 ] || { echo "rejected after ${ms:-?} ms"; return 1; }
}
check_reject_guest() {  # the guest's rping got REJECTED (8) within a second
  local real
  section "$1" guest | grep -q "RDMA_CM_EVENT_REJECTED, error 8" || { echo "guest rping was not rejected with 8"; return 1; }
  real=$(section "$1" guest | awk '$1 == "real" { m = $2; s = $3; sub(/m/, "", m); sub(/s/, "", s); print m * 60 + s }')
  awk -v r="${real:-99}" 'BEGIN { exit !(r < 1) }' || { echo "rejected after ${real:-?} s"; return 1; }
}
check_lossy_connects() {  # SIDE: that side counted CM_CONNECTS good connections
  section "$1" "$2" | grep -q "connects ok $CM_CONNECTS of $CM_CONNECTS" ||
    { echo "$(section "$1" "$2" | grep 'connects ok' || echo 'no count'): not all connects set up and verified"; return 1; }
}

cm_cases() {
  local s t
  for s in $RPING_SIZES; do
    run_case "rping-c-S$s" check_rping_c --guest-first --wait-port 7174 --timeout 120 \
      --guest "rping -s -a $GUEST_ROCE -C $RPING_COUNT -S $s -V -v" \
      --host "$BIN rping -c --transport roce -a $GUEST_ROCE -C $RPING_COUNT -S $s -V -v -d"
    run_case "rping-s-S$s" check_rping_s --host-first --delay 2 --timeout 120 \
      --host "$BIN rping -s --transport roce -a $HOST_ROCE -C $RPING_COUNT -S $s -V -v -d" \
      --guest "rping -c -a $HOST_ROCE -C $RPING_COUNT -S $s -V -v"
  done
  local z n
  for z in 65536 $PERF_MORE_SIZES; do
    n=""; [ "$z" = 65536 ] || n="-s$z"
    R_SIZE=$z
    for t in ib_write_bw ib_read_bw ib_send_bw; do
      run_case "$t-R-host-server$n" check_perftest_r --host-first --delay 2 --timeout 180 \
        --host "$BIN perf --server --perftest --transport roce -B $HOST_ROCE -p $OOB_PORT" \
        --guest "$t -d rxe0 -x $GIDX -R -F -s $z -n 200 -p $OOB_PORT $HOST_ROCE"
      local op=${t#ib_}; op=${op%_bw}
      run_case "$t-R-guest-server$n" check_perftest_r_client --guest-first --wait-port "$OOB_PORT" --timeout 180 \
        --guest "$t -d rxe0 -x $GIDX -R -F -s $z -n 200 -p $OOB_PORT" \
        --host "$BIN perf --perftest -R --transport roce --test $op -p $OOB_PORT -s $z -n 200 $GUEST_ROCE"
    done
  done
  R_SIZE=65536
  run_case "udaddy-guest-server" check_udaddy --guest-first --wait-port 7174 --timeout 120 \
    --guest "udaddy" --host "$BIN udaddy -s $GUEST_ROCE"
  run_case "udaddy-host-server" check_udaddy --host-first --delay 2 --timeout 120 \
    --host "$BIN udaddy -b $HOST_ROCE" --guest "udaddy -s $HOST_ROCE"
  # Nobody listens on 7999 (the guest runs no listener; our context listens on 7174 only).
  run_case "cm-reject-host-client" check_reject_host --guest-first --delay 1 --timeout 60 \
    --guest "sleep 3" \
    --host "a=\$(date +%s%N); $BIN rping -c --transport roce -a $GUEST_ROCE -p 7999 -C 1 -v; rc=\$?; b=\$(date +%s%N); echo elapsed_ms \$(( (b - a) / 1000000 )) rc \$rc"
  run_case "cm-reject-guest-client" check_reject_guest --host-first --delay 2 --timeout 60 \
    --host "timeout 8 $BIN rping -s --transport roce -a $HOST_ROCE -p 7174 -v; true" \
    --guest "time rping -c -a $HOST_ROCE -p 7999 -C 1 -v; true"
}

# CM_CONNECTS rping connections in a row with CM_LOSS % loss both ways; the side that loops
# counts the runs that connected and verified every ping.
lossy_cm_cases() {
  local saved=$LOSS n=$CM_CONNECTS
  LOSS=$CM_LOSS
  if ! loss_on; then record "cm-lossy (${CM_LOSS}%)" fail "could not set up the loss"; LOSS=$saved; return; fi
  run_case "cm-lossy-host-client" "check_lossy_connects_host" --guest-first --wait-port 7174 --timeout 900 \
    --guest "rping -s -P -a $GUEST_ROCE -C 2 -S 64 -V > /tmp/rps.out 2>&1 & p=\$!; i=0; while [ \$(grep -c 'DISCONNECT EVENT' /tmp/rps.out) -lt $n ] && [ \$i -lt 850 ]; do sleep 1; i=\$((i + 1)); done; kill \$p; cat /tmp/rps.out" \
    --host "ok=0; for i in \$(seq $n); do $BIN rping -c --transport roce -a $GUEST_ROCE -C 2 -S 64 -V -v -d --timeout 60 > $OUT/cm-lossy-run.out 2>&1 && grep -q 'client: 2 pings, 2 verified' $OUT/cm-lossy-run.out && ok=\$((ok + 1)); cat $OUT/cm-lossy-run.out; done; echo connects ok \$ok of $n"
  run_case "cm-lossy-guest-client" "check_lossy_connects_guest" --host-first --delay 2 --timeout 900 \
    --host ": > $OUT/cm-lossy-srv.out; $BIN rping -s -P --transport roce -a $HOST_ROCE -C 2 -S 64 -V -v -d --timeout 15 >> $OUT/cm-lossy-srv.out 2>&1 & p=\$!; i=0; while [ \$(grep -c 'DISCONNECT EVENT\|server failed' $OUT/cm-lossy-srv.out) -lt $n ] && [ \$i -lt 850 ]; do sleep 1; i=\$((i + 1)); done; kill \$p; cat $OUT/cm-lossy-srv.out" \
    --guest "ok=0; for i in \$(seq $n); do rping -c -a $HOST_ROCE -C 2 -S 64 -V -v > /tmp/rpc.out 2>&1 && [ \$(grep -c 'ping data: rdma-ping-' /tmp/rpc.out) = 2 ] && ok=\$((ok + 1)); cat /tmp/rpc.out; done; echo connects ok \$ok of $n"
  loss_off
  LOSS=$saved
}
check_lossy_connects_host() {  # and each of our DREQs reached the guest's server
  check_lossy_connects "$1" host || return 1
  local d; d=$(count_in "$1" guest '^server DISCONNECT EVENT')
  [ "$d" = "$CM_CONNECTS" ] || { echo "the guest server saw $d of $CM_CONNECTS disconnects"; return 1; }
}
check_lossy_connects_guest() {  # and our server accepted every connection and checked its pings
  # Not every session's end: Linux's rping client destroys its id right after
  # rdma_disconnect, which cancels the kernel's DREQ retries (a lost DREQ never comes and
  # our server ends that session on its --timeout), and exits whether or not the ACK of
  # our last Send got through (then our Send ends RetryExceeded). Both after the data.
  check_lossy_connects "$1" guest || return 1
  local a p m
  a=$(count_in "$1" host '^accepted '); p=$(count_in "$1" host '^server ping data: rdma-ping-')
  m=$(count_in "$1" host 'data mismatch')
  [ "$a" = "$CM_CONNECTS" ] || { echo "softrdma server accepted $a of $CM_CONNECTS connections"; return 1; }
  [ "$p" = $((2 * CM_CONNECTS)) ] && [ "$m" = 0 ] ||
    { echo "softrdma server checked $p of $((2 * CM_CONNECTS)) pings ($m mismatches)"; return 1; }
}

# ---- the C ABI: Debian's programs on softrdma (softrdma run) -------------------------------
CAPI_DEV="" CAPI_GIDX=""
# capi_setup: the RoCE device of HOST_ROCE and the index of its GID ::ffff:HOST_ROCE, as the
# library reports them in the namespace (ibv_devinfo -v through softrdma run); 1 if none.
capi_setup() {
  local info
  info=$(H "$BIN" run -- ibv_devinfo -v 2>&1) || { CAPI_WHY="softrdma run -- ibv_devinfo -v failed: $(tail -1 <<<"$info")"; return 1; }
  read -r CAPI_DEV CAPI_GIDX < <(awk -v gid="::ffff:$HOST_ROCE," '
    $1 == "hca_id:" { dev = $2 }
    /GID\[ *[0-9]+\]:/ && $NF != "" && index($0, gid) { i = $0; sub(/.*GID\[ */, "", i); sub(/\].*/, "", i); print dev, i; exit }' <<<"$info")
  [ -n "$CAPI_DEV" ] && [ -n "$CAPI_GIDX" ] || { CAPI_WHY="no softrdma RoCE device with GID ::ffff:$HOST_ROCE"; return 1; }
  say "C ABI: $CAPI_DEV, GID index $CAPI_GIDX (::ffff:$HOST_ROCE)"
}
capi_run() { echo "$BIN run ${1:+--transport $1} --"; }    # [TRANSPORT]: the prefix of a host command
capi_pp() {  # TYPE SIZE [SERVER]: Debian's ibv_*_pingpong on our RoCE device
  echo "$(capi_run) ibv_$1_pingpong -d $CAPI_DEV -g $CAPI_GIDX -p $OOB_PORT -s $2 -n $COUNT -c $(pp_mtu "$1") ${3:-}"
}
capi_perf() {  # [SERVER]: Debian's ib_write_bw (perftest's TCP exchange, no -R) on our RoCE device
  echo "$(capi_run) ib_write_bw -d $CAPI_DEV -x $CAPI_GIDX -p $OOB_PORT -F -n $PERF_COUNT -s $PERF_SIZE ${1:-}"
}

# The C ABI's rping checks are interop-lib.sh's (count_o, check_capi_rping_c/_s); the pings
# each side must print:
capi_pings() { echo "$RPING_COUNT"; }
check_capi_pp() {  # both pingpongs finished (-c: the server checked the data); each saw the other's GID
  check_pp_side "$1" guest "guest ibv_*_pingpong" || return 1
  check_pp_side "$1" host "host ibv_*_pingpong (C ABI)" || return 1
  section "$1" guest | grep -q "remote address: .*GID ::ffff:$HOST_ROCE" ||
    { echo "the guest did not get GID ::ffff:$HOST_ROCE from us"; return 1; }
  section "$1" host | grep -q "remote address: .*GID ::ffff:$GUEST_ROCE" ||
    { echo "we did not get GID ::ffff:$GUEST_ROCE from the guest"; return 1; }
}
check_capi_perf() {  # both sides printed the '65536 100 ...' result line
  local side
  for side in guest host; do
    section "$1" $side | grep -qE "^[[:space:]]*${PERF_SIZE}[[:space:]]+${PERF_COUNT}[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+" ||
      { echo "the $side ib_write_bw printed no '$PERF_SIZE $PERF_COUNT ...' result line"; return 1; }
  done
}

capi_names() {
  local s t sizes
  for s in $CAPI_RPING_SIZES; do echo "capi-rping-c-S$s capi-rping-s-S$s"; done
  for t in rc ud; do
    sizes=$SIZES; [ "$t" = ud ] && sizes=$UD_SIZES
    for s in $sizes; do echo "capi-${t}_pingpong-s$s-guest-server capi-${t}_pingpong-s$s-host-server"; done
  done
  [ "$PERFTEST" = 1 ] && echo "capi-ib_write_bw-guest-server capi-ib_write_bw-host-server"
  [ "$CM" = 1 ] && echo "capi-udaddy-guest-server capi-udaddy-host-server"
  [ "$LOSSY" = 1 ] && echo "capi-lossy-rc_pingpong-s4096-guest-server"
}
any_selected() { local n; for n in "$@"; do selected "$n" && return 0; done; return 1; }
CAPI_OK=""
capi_ready() {  # once: the device, or a failure recorded (and the cases not run)
  [ -n "$CAPI_OK" ] || { if capi_setup; then CAPI_OK=1; else CAPI_OK=0; record "capi (setup)" fail "$CAPI_WHY"; fi; }
  [ "$CAPI_OK" = 1 ]
}

capi_cases() {
  # shellcheck disable=SC2046
  any_selected $(capi_names) || return 0
  capi_ready || return 0
  local s t sizes
  for s in $CAPI_RPING_SIZES; do
    run_case "capi-rping-c-S$s" check_capi_rping_c --guest-first --wait-port 7174 --timeout 120 \
      --guest "rping -s -a $GUEST_ROCE -C $RPING_COUNT -S $s -V -v" \
      --host "$(capi_run roce) rping -c -a $GUEST_ROCE -C $RPING_COUNT -S $s -V -v"
    run_case "capi-rping-s-S$s" check_capi_rping_s --host-first --delay 2 --timeout 120 \
      --host "$(capi_run roce) rping -s -a $HOST_ROCE -C $RPING_COUNT -S $s -V -v" \
      --guest "rping -c -a $HOST_ROCE -C $RPING_COUNT -S $s -V -v"
  done
  for t in rc ud; do
    sizes=$SIZES; [ "$t" = ud ] && sizes=$UD_SIZES
    for s in $sizes; do
      run_case "capi-${t}_pingpong-s$s-guest-server" check_capi_pp --guest-first --wait-port "$OOB_PORT" \
        --timeout "$PP_TIMEOUT" --guest "$(guest_pp "$t" "$s")" --host "$(capi_pp "$t" "$s" "$GUEST_ROCE")"
      run_case "capi-${t}_pingpong-s$s-host-server" check_capi_pp --host-first --wait-port "$OOB_PORT" \
        --timeout "$PP_TIMEOUT" --host "$(capi_pp "$t" "$s")" --guest "$(guest_pp "$t" "$s" "$HOST_ROCE")"
    done
  done
  if [ "$PERFTEST" = 1 ]; then
    run_case "capi-ib_write_bw-guest-server" check_capi_perf --guest-first --wait-port "$OOB_PORT" \
      --timeout "$PERF_TIMEOUT" --guest "$(guest_perf write)" --host "$(capi_perf "$GUEST_ROCE")"
    run_case "capi-ib_write_bw-host-server" check_capi_perf --host-first --wait-port "$OOB_PORT" \
      --timeout "$PERF_TIMEOUT" --host "$(capi_perf)" --guest "$(guest_perf write "$HOST_ROCE")"
  fi
  if [ "$CM" = 1 ]; then
    run_case "capi-udaddy-guest-server" check_udaddy --guest-first --wait-port 7174 --timeout 120 \
      --guest "udaddy" --host "$(capi_run roce) udaddy -s $GUEST_ROCE"
    run_case "capi-udaddy-host-server" check_udaddy --host-first --delay 2 --timeout 120 \
      --host "$(capi_run roce) udaddy -b $HOST_ROCE" --guest "udaddy -s $HOST_ROCE"
  fi
}
# Under loss (lossy_cases has it on): the guest's rc_pingpong server against Debian's client on
# softrdma; the server checks every page (-c).
capi_lossy_cases() {
  selected capi-lossy-rc_pingpong-s4096-guest-server || return 0
  capi_ready || return 0
  local g0 h0 g1 h1
  read -r g0 h0 < <(net_loss_counts "$VMRUN" eth0)
  run_case "capi-lossy-rc_pingpong-s4096-guest-server" check_capi_pp --guest-first --wait-port "$OOB_PORT" \
    --timeout "$LOSSY_TIMEOUT" --guest "$(guest_pp rc 4096)" --host "$(capi_pp rc 4096 "$GUEST_ROCE")"
  read -r g1 h1 < <(net_loss_counts "$VMRUN" eth0)
  NOTES+=("capi-lossy-rc_pingpong-s4096-guest-server: loss dropped $((g1 - g0)) packets guest -> host, $((h1 - h0)) host -> guest")
}

# ---- case groups --------------------------------------------------------------------------
have_pingpong() { "$BIN" pingpong --help >/dev/null 2>&1; }
have_perf_roce() { "$BIN" perf --help 2>&1 | grep -q -- '--transport'; }

# Our pingpong client's own capture (--pcap) against the guest's ibv_rc_pingpong: it decodes
# strictly (every ICRC, the headers we synthesise over the IPv4 Identification the ICRC was
# computed with included), holds every RoCEv2 message the bridge saw, and --counters counts
# COUNT round trips of 4096 octets at PMTU 1024 (4 request packets each).
own_capture_case() {
  have_pingpong || return 0
  run_case "rc_pingpong-s4096-own-pcap" check_own_capture --guest-first --wait-port "$OOB_PORT" \
    --timeout "$PP_TIMEOUT" --guest "$(guest_pp rc 4096)" \
    --host "$(host_pp rc 4096 "--counters --pcap $OUT/rc_pingpong-s4096-own-pcap.own.pcap $GUEST_ROCE")"
}
check_own_capture() {
  check_pp "$1" || return 1
  local own=${1%.log}.own.pcap bridge=${1%.log}.pcap a b
  "$BIN" decode --strict "$own" >"${1%.log}.own.decode" 2>&1 ||
    { echo "decode --strict of our own capture $own failed"; return 1; }
  a=$(grep -c ' RoCEv2 ' "${1%.log}.own.decode" || true)
  b=$("$BIN" decode "$bridge" 2>/dev/null | grep -c ' RoCEv2 ' || true)
  # One RoCEv2 message per datagram: the bridge may miss only what tcpdump dropped.
  [ "$a" -gt 0 ] && { [ "$a" = "$b" ] || fewer_by_drops "$(basename "${1%.log}")" "$a" "$b" "$(case_drops "$1")" 1; } ||
    { echo "our capture has $a RoCEv2 messages, the bridge's $b"; return 1; }
  section "$1" host | grep -qE "^  requester.packets +$((4 * COUNT))\$" ||
    { echo "requester.packets is not $((4 * COUNT))"; return 1; }
}

pp_cases() {  # PREFIX TIMEOUT
  local p=$1 to=$2 t s sizes
  for t in rc uc ud; do
    [[ "$p" == lossy-* ]] && [ "$t" != rc ] && continue      # UC/UD lose whole messages
    sizes=$SIZES; [ "$t" = ud ] && sizes=$UD_SIZES
    for s in $sizes; do
      if ! have_pingpong; then
        selected "$p${t}_pingpong-s$s-guest-server" &&
          record "$p${t}_pingpong-s$s-guest-server" skip "softrdma has no 'pingpong' subcommand yet"
        selected "$p${t}_pingpong-s$s-host-server" &&
          record "$p${t}_pingpong-s$s-host-server" skip "softrdma has no 'pingpong' subcommand yet"
        continue
      fi
      run_case "$p${t}_pingpong-s$s-guest-server" check_pp --guest-first --wait-port "$OOB_PORT" \
        --timeout "$to" --guest "$(guest_pp "$t" "$s")" --host "$(host_pp "$t" "$s" "$GUEST_ROCE")"
      run_case "$p${t}_pingpong-s$s-host-server" check_pp --host-first --wait-port "$OOB_PORT" \
        --timeout "$to" --host "$(host_pp "$t" "$s")" --guest "$(guest_pp "$t" "$s" "$HOST_ROCE")"
    done
  done
}

perftest_cases() {  # PREFIX TIMEOUT [MORE-SIZES: Write and Read again, named ...-s<size>]
  local p=$1 to=$2 t z size=$PERF_SIZE
  for t in write read atomic; do
    if ! have_perf_roce; then
      selected "$p""ib_${t}_bw-guest-server" &&
        record "$p""ib_${t}_bw-guest-server" skip "softrdma perf has no --transport roce yet (command line to adjust)"
      continue
    fi
    run_case "$p""ib_${t}_bw-guest-server" check_perf --guest-first --wait-port "$OOB_PORT" --timeout "$to" \
      --guest "$(guest_perf "$t")" --host "$(host_perf "$t")"
    [ "$t" = atomic ] && continue
    for z in ${3:-}; do
      PERF_SIZE=$z
      run_case "$p""ib_${t}_bw-guest-server-s$z" check_perf --guest-first --wait-port "$OOB_PORT" --timeout "$to" \
        --guest "$(guest_perf "$t")" --host "$(host_perf "$t")"
      PERF_SIZE=$size
    done
  done
}

# Loss: the host kernel may lack sch_netem (this one does), so netem goes on the guest's eth0
# egress (guest -> host: our responder sees gaps, our requester loses ACKs); host -> guest
# drops only if nft exists here (numgen in the rdmavm namespace).
VMRUN=""
loss_on() { net_loss_on "$VMRUN" eth0 "$GUEST_ROCE" "$LOSS" "udp dport 4791"; }
loss_off() { net_loss_off "$VMRUN" eth0; }

lossy_cases() {
  if ! loss_on; then record "lossy (netem ${LOSS}%)" fail "could not set up the loss"; return; fi
  pp_cases "lossy-" "$LOSSY_TIMEOUT"
  # Our requester against rxe's responder with loss both ways: multi-packet READs re-issued
  # from the missing response (rxe replays them as Middle/Last), WRITE go-back, ATOMIC replay.
  [ "$PERFTEST" = 1 ] && perftest_cases "lossy-" "$LOSSY_TIMEOUT"
  [ "$CAPI" = 1 ] && capi_lossy_cases
  loss_off
}

# --guest-selfcheck: each guest command line against itself, both ends in the guest (rxe
# loopback; no RoCE reaches the bridge). Checks the command lines, not softrdma.
self_pair() {  # NAME SERVER-CMD CLIENT-CMD CHECK-REGEX
  selected "$1" || return 0
  local job out rc src
  say "selfcheck $1"
  job=$(vm_spawn "$VMRUN" "timeout 120 $2" srv)
  vm_exec "$VMRUN" "vm-wait-listen $OOB_PORT 30" 40 >/dev/null 2>&1
  out=$(vm_exec "$VMRUN" "timeout 120 $3" 130 2>&1); rc=$?
  out+=$'\n'$(vm_wait "$VMRUN" "$job" 130 2>&1); src=$?
  printf '%s\n' "$out" >"$OUT/selfcheck-$1.log"
  if [ $rc != 0 ] || [ $src != 0 ]; then
    record "selfcheck-$1" fail "client rc $rc, server rc $src (log $OUT/selfcheck-$1.log)"
  elif grep -q "invalid data in page" <<<"$out"; then
    record "selfcheck-$1" fail "invalid data (log $OUT/selfcheck-$1.log)"
  elif ! grep -qE "$4" <<<"$out"; then
    record "selfcheck-$1" fail "no line matching '$4' (log $OUT/selfcheck-$1.log)"
  else
    record "selfcheck-$1" pass ""
  fi
}
selfcheck() {
  local t s sizes sz
  for t in rc uc ud; do
    sizes=$SIZES; [ "$t" = ud ] && sizes=$UD_SIZES
    for s in $sizes; do
      self_pair "${t}_pingpong-s$s" "$(guest_pp "$t" "$s")" "$(guest_pp "$t" "$s" "$GUEST_ROCE")" \
        "^$COUNT iters in "
    done
  done
  for t in write read atomic; do
    sz=$PERF_SIZE; [ "$t" = atomic ] && sz=8
    self_pair "ib_${t}_bw" "$(guest_perf "$t")" "$(guest_perf "$t" "$GUEST_ROCE")" \
      "^[[:space:]]*${sz}[[:space:]]+${PERF_COUNT}[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+"
  done
}

start_vm() {
  "$INTEROP" --stop >/dev/null 2>&1
  say "booting the VM"
  "$INTEROP" --start >/dev/null || { say "VM boot failed"; return 1; }
  VMRUN=$("$INTEROP" --status | sed -n 's/^running: //p')
  [ -n "$VMRUN" ] || { say "no persistent VM after --start"; return 1; }
  say "VM up: $VMRUN ($(vm_exec "$VMRUN" 'ibv_devinfo -d rxe0 | grep active_mtu' 20 | tr -s ' \t\n' ' '))"
}
trap 'loss_off; "$INTEROP" --stop >/dev/null 2>&1' EXIT

if start_vm; then
  if [ "$SELFCHECK" = 1 ]; then
    selfcheck
  else
    pp_cases "" "$PP_TIMEOUT"
    own_capture_case
    [ "$PERFTEST" = 1 ] && perftest_cases "" "$PERF_TIMEOUT" "$PERF_MORE_SIZES"
    [ "$CM" = 1 ] && cm_cases
    [ "$CM" = 1 ] && [ "$LOSSY" = 1 ] && lossy_cm_cases
    [ "$CAPI" = 1 ] && capi_cases
    [ "$LOSSY" = 1 ] && lossy_cases
  fi
else
  record "boot" fail "the VM did not boot"
fi

echo
echo "interop-rxe: $PASSED passed, $FAILED failed, $SKIPPED skipped (logs and pcaps in $OUT)"
printf '%s\n' "${RESULTS[@]}"
[ ${#NOTES[@]} = 0 ] || { echo "notes:"; printf '  %s\n' "${NOTES[@]}"; }
[ "$FAILED" = 0 ] && [ "$SKIPPED" = 0 ]
