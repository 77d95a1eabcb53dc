#!/usr/bin/env bash
# interop-siw.sh - softrdma against the Linux kernel's siw (issue 3, Done-when 4; lossy and
# kill/reset cases: issue 14, Done-when 4).
#
# Builds `softrdma` (release) and runs interop cases through ../shared/interop-vm/interop.sh,
# one persistent VM per siw build: the guest (10.77.1.2 = siw0) runs Linux rping / perftest,
# the host side (namespace rdmavm, 10.77.1.1) runs softrdma.
#
#   rping-c-S<size>        softrdma rping -c  vs  guest rping -s   (-C 10 -S size -V)
#   rping-s-S<size>        guest rping -c     vs  softrdma rping -s (-C 10 -S size -V)
#   ib_{write,read,send}_bw  guest ib_*_bw -R  vs  softrdma perf --server --perftest
#   ib_{write,read}_bw-R-guest-server  guest ib_*_bw -R server  vs  softrdma perf --perftest -R
#                          (65536-octet messages; the same cases with -s<size> appended run
#                          the other sizes of --perf-sizes)
#   rping-c-S1000-own-pcap our client's own --pcap capture decodes strictly, holds the
#                          messages the bridge saw, and its --counters match the exchange
#   crc-...                the rping cases again against siw built with SIW_MPA_CRC=1
#   lossy-rping-{c,s}-S<size>  the rping cases with --loss % loss both ways (--lossy-sizes,
#                          --lossy-count pings): netem on the guest's siw netdev (guest ->
#                          host) and an nft rule in the host namespace dropping that share of
#                          TCP toward the guest's siw address (host -> guest; needs nftables
#                          on the host: `apt-get install -y nftables`). iWARP rides TCP: loss
#                          means retransmissions, and every ping must still verify
#   lossy-ib_{write,read,send}_bw-R, lossy-ib_{write,read}_bw-R-guest-server  the perftest
#                          cases with the same loss
#   kill-rping-guest-{server,client}  the guest's rping killed (SIGKILL) after --kill-after
#                          pings: our side ends that connection with flushed work requests
#                          (no hang, no crash) and a new connection then runs verified pings
#   reset-rping-guest-{server,client}  the same, the connection reset instead: an nft
#                          `reject with tcp reset` rule for that one connection answers our
#                          next segment with an RST (as from the guest; nftables again)
#   kill-ib_write_bw-R-guest-{client,server}  guest ib_write_bw -R killed mid-transfer (4 MiB
#                          through the guest's siw NIC), against our perftest server / client;
#                          then a new session completes
#
# The C ABI cases (issue 43): the host side is an unmodified Debian program run on softrdma's
# iWARP device (softrdma_tcp0) through `softrdma run --transport iwarp` (libsoftrdma_capi.so as
# libibverbs/librdmacm):
#   capi-rping-c-S<size>   host rping -c -V  vs  guest rping -s (--capi-rping-sizes, -C 10; the
#                          client compares every pong)
#   capi-rping-s-S<size>   guest rping -c -V  vs  host rping -s
#   capi-ib_{write,read}_bw-R-host-server, capi-ib_send_lat-R-host-server  host perftest -R server
#                          vs guest perftest -R client (65536 octets x 200; ib_send_lat 2 x 200)
#   capi-ib_{write,read}_bw-R-guest-server, capi-ib_send_lat-R-guest-server  the other role, host
#                          perftest -R client vs guest server (see the note at capi_perf_cases)
#   capi-lossy-rping-c-S65535  capi-rping-c at --loss % both ways (--lossy-count pings)
#   nudge-rping-c-S64, nudge-capi-ib_write_bw-R-guest-server  our client with
#                          SOFTRDMA_NUDGE_AFTER_MS=0: the silent-peer nudge on every connection
#                          (a zero-length Write to STag 0), which the capture must show and siw
#                          must take
# librdmacm's active side on softrdma asks for MPA's client-server mode, as siw's does. siw
# 6.12's siw_accept puts the QP's receive upcall (peer-to-peer mode: the RTR's) on the socket
# only after sending its MPA Reply, and leaves FPDUs that came first unread until the next
# segment; under TCG the guest is slow enough there for our first Send (or RTR) to come first.
# Our initiator answers that with its nudge (a zero-length Write to STag 0, 20 ms
# after its first FPDU with nothing heard; docs/iwarp-engine-design.md), so such a case must
# pass; a failure whose capture shows the Reply as the guest's last word is named "the
# siw_accept race" in its reason. Taking such a connection down has crashed the guest's
# kernel; after any case that leaves a kernel crash on the guest's console, the case fails
# and the VM is booted again.
#
# Each case's bridge capture is decoded with `softrdma decode --strict`, whole and cut at 128
# octets a frame as `tcpdump -s 128` takes it (with editcap). Prints PASS/FAIL per
# case and a summary; exits 0 only if every case passed. Needs root and /dev/net/tun (the VM's
# network namespace and taps); takes a few minutes under TCG.
#
# Options: --sizes "26 64 ..."  --count N  --no-crc  --no-perftest  --no-build
#          --perf-sizes "65536 2 ..." (perftest message sizes; the lossy cases run 65536)
#          --only REGEX (case names)  --out DIR (logs and pcaps; default target/interop-siw)
#          --mtu N (the VM's NIC and the bridge, e.g. 9000: jumbo frames, larger FPDUs)
#          --rx-direct-min N (softrdma reads payloads of N octets and more straight into
#          registered memory; the default, 16384, is above siw's FPDUs over this link, so
#          `--rx-direct-min 1` is how the direct receive path meets siw)
#          --loss PCT (integer, default 2)  --lossy-sizes "64 4096 65535"
#          --lossy-count N (default 100)  --lossy-timeout S (per lossy case, default 300)
#          --no-lossy  --no-kill (the kill/reset cases)  --kill-after N (pings, default 20)
#          --no-capi (the C ABI cases)  --capi-rping-sizes "64 4096 65535"
#          --no-capi-host-clients (leave out the capi-...-R-guest-server cases)
# Environment: SOFTRDMA_BIN (default target/release/softrdma; --no-build implied if set)
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VMDIR=${INTEROP_VM_DIR:-$(dirname "$0")/../../shared/interop-vm}
VMDIR=$(cd "$VMDIR" && pwd)
# only_capture_gaps (the rest of it is redefined below, as this script keeps its own books).
. "$REPO/scripts/interop-lib.sh"
STATE=${INTEROP_VM_STATE:-/var/tmp/interop-vm}
# rping accepts -S 23..65535 (RPING_MIN_BUFSIZE .. RPING_BUFSIZE - 1).
SIZES="23 26 64 1000 4096 65535"
COUNT=10
CRC=1 PERFTEST=1 BUILD_BIN=1 MTU=""
LOSS=2 LOSSY=1 LOSSY_SIZES="64 4096 65535" LOSSY_COUNT=100 LOSSY_TIMEOUT=300
KILL=1 KILL_AFTER=20
CAPI=1 CAPI_RPING_SIZES="64 4096 65535" CAPI_HOST_CLIENTS=1
# perftest message sizes: the smallest, one over a page, over a 64 KiB FPDU's worth, 1 MiB.
PERF_SIZES="65536 2 4097 1048576"
# Per-case limits of the plain cases (the lossy ones raise them).
RPING_TIMEOUT=120 PERF_TIMEOUT=180
OUT=$REPO/target/interop-siw
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) SIZES=$2; shift ;;
    --count) COUNT=$2; shift ;;
    --no-crc) CRC=0 ;;
    --no-perftest) PERFTEST=0 ;;
    --perf-sizes) PERF_SIZES=$2; shift ;;
    --no-build) BUILD_BIN=0 ;;
    --only) ONLY=$2; shift ;;
    --out) OUT=$2; shift ;;
    --mtu) MTU=$2; shift ;;
    --rx-direct-min) export SOFTRDMA_RX_DIRECT_MIN=$2; shift ;;
    --loss) LOSS=$2; shift ;;
    --lossy-sizes) LOSSY_SIZES=$2; shift ;;
    --lossy-count) LOSSY_COUNT=$2; shift ;;
    --lossy-timeout) LOSSY_TIMEOUT=$2; shift ;;
    --no-lossy) LOSSY=0 ;;
    --no-kill) KILL=0 ;;
    --kill-after) KILL_AFTER=$2; shift ;;
    --no-capi) CAPI=0 ;;
    --capi-rping-sizes) CAPI_RPING_SIZES=$2; shift ;;
    --capi-host-clients) CAPI_HOST_CLIENTS=1 ;;
    --no-capi-host-clients) CAPI_HOST_CLIENTS=0 ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 0 ;;
    *) echo "interop-siw.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

# nft's numgen compares integers.
[[ "$LOSS" =~ ^[0-9]+$ ]] && [ "$LOSS" -le 100 ] || { echo "interop-siw.sh: --loss takes an integer 0..100" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "interop-siw.sh: needs root (network namespace, taps)" >&2; exit 2; }
[ -c /dev/net/tun ] || { echo "interop-siw.sh: needs /dev/net/tun" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=${SOFTRDMA_BIN:-$REPO/target/release/softrdma}
if [ "$BUILD_BIN" = 1 ] && [ -z "${SOFTRDMA_BIN:-}" ]; then
  # softrdma-capi: libsoftrdma_capi.so beside the binary, where `softrdma run` finds it
  (cd "$REPO" && cargo build --release -p softrdma-cli -p softrdma-capi) || exit 1
fi
[ -x "$BIN" ] || { echo "interop-siw.sh: no $BIN" >&2; exit 2; }
# interop.sh --start writes its boot log under runs/ without creating it.
mkdir -p "$STATE/runs"

INTEROP=$VMDIR/interop.sh
# vm_exec for the loss setup (functions only).
# shellcheck source=/dev/null
. "$VMDIR/vmctl.sh"
NS=${NETNS:-rdmavm}
GUEST_SIW=10.77.1.2 HOST_SIW=10.77.1.1
RESULTS=() NOTES=()
PASSED=0 FAILED=0

say() { echo "[interop-siw $(date +%T)] $*" >&2; }

# count_lines FILE REGEX: how many lines of FILE match
count_lines() { grep -cE "$2" "$1" 2>/dev/null || true; }

# record NAME OK REASON
record() {
  if [ "$2" = 1 ]; then
    RESULTS+=("PASS  $1")
    PASSED=$((PASSED + 1)); echo "PASS  $1"
  else
    RESULTS+=("FAIL  $1: $3")
    FAILED=$((FAILED + 1)); echo "FAIL  $1: $3"
  fi
}

# decode_check NAME PCAP CASE-LOG: softrdma decode --strict of the case's capture. Under TCG
# tcpdump on the bridge drops packets of bulk transfers ("dropped by kernel"); a capture with
# holes cannot decode cleanly, so that is reported as a note, not a failure.
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
  # Every error the decoder counted is a hole in the capture (no message failed a check).
  if only_capture_gaps "$log" "$dropped"; then
    say "$1: decode --strict: capture incomplete (tcpdump dropped $dropped packets): $(tail -1 "$log")"
    NOTES+=("$1: capture incomplete (tcpdump dropped $dropped packets), decode saw only TCP gaps")
    return 0
  fi
  say "$1: decode --strict failed, see $log"
  return 1
}

# run_case NAME CHECK_FN interop.sh-args...: one interop.sh case, its log, its verdict
ONLY=${ONLY:-}
selected() { [ -z "$ONLY" ] || [[ "$1" =~ $ONLY ]]; }
run_case() {
  local name=$1 check=$2; shift 2
  selected "$name" || return 0
  local log=$OUT/$name.log pcap=$OUT/$name.pcap
  # A crash the guest's console showed only after the case before had been judged (its
  # connections' teardown): that case's failure, not this one's, which gets a fresh VM.
  if [ -n "${LAST_CASE:-}" ] && [ "$(guest_crashes)" -gt "${LAST_K:-0}" ]; then
    local late
    late=$(guest_crash_lines | tail -n +$((LAST_K + 1)) | head -1 | sed 's/^\[ *[0-9.]*\] //')
    record "$LAST_CASE (teardown)" 0 "the guest kernel crashed after the case ended: $late (console $VMRUN/console.log)"
    NOTES+=("$LAST_CASE: the guest kernel crashed after the case ended ($late); the VM was booted again")
    reboot_vm
  fi
  say "case $name"
  local l0 k0
  [ -n "${LOSS_ON:-}" ] && l0=$(loss_counts)
  k0=$(guest_crashes)
  "$INTEROP" --attach --pcap "$pcap" "$@" >"$log" 2>&1
  local rc=$? why=""
  if [ -n "${LOSS_ON:-}" ]; then
    # The loss this case met (netem and nft counters before and after it).
    local g0 h0 g1 h1
    read -r g0 h0 <<<"$l0"; read -r g1 h1 < <(loss_counts)
    echo "=== loss: $((g1 - g0)) packets dropped guest -> host, $((h1 - h0)) host -> guest" >>"$log"
    NOTES+=("$name: loss dropped $((g1 - g0)) packets guest -> host, $((h1 - h0)) host -> guest")
  fi
  if [ $rc != 0 ]; then
    why="interop.sh exit $rc ($(grep -m1 -E '^=== interop' "$log" || echo 'no result line'))"
  else
    why=$("$check" "$log" 2>&1) || { [ -n "$why" ] || why="check $check failed"; }
  fi
  if [ -z "$why" ] && ! decode_check "$name" "$pcap" "$log"; then
    why="decode --strict of $pcap failed"
  fi
  [ -n "$why" ] && [[ "$name" == capi-* ]] && why+=$(accept_race_hint "$pcap")$(tagged_skip_hint "$pcap")
  # A failed case may leave the guest's kernel crashing as it tears down (siw, iw_cm): give it
  # a moment, and boot a fresh VM for the cases after it (the crash is this case's failure).
  [ $rc != 0 ] && sleep 2
  if [ "$(guest_crashes)" -gt "$k0" ]; then
    local crash
    crash=$(guest_crash_lines | tail -n +$((k0 + 1)) | head -1 | sed 's/^\[ *[0-9.]*\] //')
    why="${why:+$why; }the guest kernel crashed: $crash (console $VMRUN/console.log)"
    NOTES+=("$name: the guest kernel crashed ($crash); the VM was booted again")
    reboot_vm
  fi
  grep -q '^--- siw close race' "$log" &&
    NOTES+=("$name: siw failed the guest perftest's last record after the test (close race, see g_close_race)")
  # perftest's clock calibration fails on a loaded host ("Correlation coefficient", then no
  # figures): such a case runs once more (and says so); a second failure stands. siw's accept
  # race is not retried: our initiator's nudge answers it.
  local again=""
  [ -n "$why" ] && grep -q 'Correlation coefficient r^2' "$log" && again="perftest's clock calibration failed"
  if [ -n "$again" ] && [[ "$why" != *"kernel crashed"* ]] && [ -z "${AGAIN:-}" ]; then
    NOTES+=("$name: the first run met $again ($log.1); run again")
    mv "$log" "$log.1"; mv "$pcap" "$pcap.1" 2>/dev/null
    AGAIN=1 run_case "$name" "$check" "$@"
    return
  fi
  if [ -z "$why" ]; then record "$name" 1 ""; else record "$name" 0 "$why (log $log)"; fi
  LAST_CASE=$name LAST_K=$(guest_crashes)
}

# Checks: print a reason and fail, or print nothing.
check_softrdma_client() {  # our client printed COUNT verified pings
  local n; n=$(count_lines "$1" '^ping data: rdma-ping-')
  [ "$n" = "$COUNT" ] || { echo "softrdma client printed $n of $COUNT pings"; return 1; }
  grep -q "client: $COUNT pings, $COUNT verified" "$1" || { echo "softrdma client did not verify $COUNT pings"; return 1; }
}
check_softrdma_server() {  # the guest client saw COUNT pings (its -V passed), we read and checked them
  local g s; g=$(count_lines "$1" '^ping data: rdma-ping-'); s=$(count_lines "$1" '^server ping data: rdma-ping-')
  [ "$g" = "$COUNT" ] || { echo "guest rping client printed $g of $COUNT pings"; return 1; }
  [ "$s" = "$COUNT" ] || { echo "softrdma server printed $s of $COUNT pings"; return 1; }
  grep -q "server: $COUNT pings, $COUNT verified" "$1" || { echo "softrdma server did not verify $COUNT pings"; return 1; }
}
check_crc_too() {  # as the rping checks, and the connection really ran with CRC
  "$2" "$1" || return 1
  grep -qE "(connected|accepted) .*CRC true" "$1" || { echo "the connection did not negotiate CRC"; return 1; }
}
check_crc_client() { check_crc_too "$1" check_softrdma_client; }
check_crc_server() { check_crc_too "$1" check_softrdma_server; }
check_perftest() {  # the guest's perftest printed its result line; our server saw the session
  grep -qE '^ *[0-9]+[[:space:]]+[0-9]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+' "$1" ||
    { echo "no perftest result line"; return 1; }
  grep -q "perftest session done" "$1" || { echo "softrdma perf --perftest did not finish its session"; return 1; }
}

rping_cases() {  # CASE-PREFIX CHECK-PREFIX [EXTRA-FLAGS-OF-OUR-CLIENT]
  local p=$1 c=$2 x=${3:-} s
  for s in $SIZES; do
    run_case "${p}rping-c-S$s" "check_${c}client" --guest-first --wait-port 7174 --timeout "$RPING_TIMEOUT" \
      --guest "rping -s -a $GUEST_SIW -C $COUNT -S $s -V -v" \
      --host "$BIN rping -c -a $GUEST_SIW -C $COUNT -S $s -V -v -d $x"
    run_case "${p}rping-s-S$s" "check_${c}server" --host-first --wait-port 7174 --timeout "$RPING_TIMEOUT" \
      --host "$BIN rping -s -a $HOST_SIW -C $COUNT -S $s -V -v -d" \
      --guest "rping -c -a $HOST_SIW -C $COUNT -S $s -V -v"
  done
}

PERF_SIZE=65536
check_perftest_client() {  # both printed a result line for PERF_SIZE octets x 200
  local side
  for side in guest host; do
    awk -v want="=== $side " 'index($0, "=== ") == 1 { on = (index($0, want) == 1); next } on' "$1" |
      grep -qE "^ *$PERF_SIZE[[:space:]]+200[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+" ||
      { echo "no result line for $PERF_SIZE octets from the $side"; return 1; }
  done
}

# g_close_race FILE: guest sh for after a perftest server's run (its output in FILE, its
# exit status in $r). siw (6.12 siw_qp_tx.c) fails a Send whose last segment is already on
# the wire when the peer's FIN comes before siw looks at tx_suspend: perftest's server then
# gets "Bad wc status 2" for its last out-of-band record, after the test and its result
# line, because our client closes right after that record (as perftest's own client does,
# only sooner). That exact ending counts as the server's success, with a marker line. The
# capi-...-R-host-server cases use it for the guest's client: there Debian's perftest server
# on softrdma closes right after the client's last record.
g_close_race() {
  echo "[ \$r != 0 ] && awk '/^[[:space:]]*[0-9]+[[:space:]]+[0-9]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+/ { t = 1 } /Bad wc status 2/ && t { b = 1 } /^Failed to close connection between server and client/ && b { f = 1 } END { exit !f }' $1 && { echo \"--- siw close race: exit \$r after the result line\"; r=0; }"
}

perftest_cases() {  # [CASE-PREFIX [SIZES]]: 65536-octet cases keep their plain names
  local p=${1:-} t z n
  for z in ${2:-$PERF_SIZES}; do
    n=""; [ "$z" = 65536 ] || n="-s$z"
    PERF_SIZE=$z
    for t in ib_write_bw ib_read_bw ib_send_bw; do
      run_case "$p$t-R$n" check_perftest --host-first --wait-port 18515 --timeout "$PERF_TIMEOUT" \
        --host "$BIN perf --server --perftest -B $HOST_SIW -p 18515" \
        --guest "$t -d siw0 -R -F -s $z -n 200 $HOST_SIW"
    done
    # Our client of perftest's rdma_cm servers (Send over iWARP would need perftest's credit
    # scheme on the client side, which ours does not keep).
    for t in write read; do
      run_case "${p}ib_${t}_bw-R-guest-server$n" check_perftest_client --guest-first --wait-port 18515 --timeout "$PERF_TIMEOUT" \
        --guest "ib_${t}_bw -d siw0 -R -F -s $z -n 200 > /tmp/psrv.out 2>&1; r=\$?; cat /tmp/psrv.out
$(g_close_race /tmp/psrv.out); exit \$r" \
        --host "$BIN perf --perftest -R --test $t -p 18515 -s $z -n 200 $GUEST_SIW"
    done
  done
  PERF_SIZE=65536
}

# guest_crash_lines: the kernel crashes (BUG, Oops, panic) of the VM so far, from the guest's
# own log, which holds them as they happen (the serial console's copy lagged behind the end
# of the case whose teardown crashed it); from the console if the guest does not answer.
CRASH_RE='^\[ *[0-9.]+\] (kernel BUG at|Oops:|BUG: |general protection fault|Kernel panic)'
guest_crash_lines() {
  [ -n "${VMRUN:-}" ] || return 0
  local d
  if d=$(vm_exec "$VMRUN" dmesg 20 2>/dev/null); then
    grep -E "$CRASH_RE" <<<"$d"
  else
    grep -E "$CRASH_RE" "$VMRUN/console.log" 2>/dev/null
  fi
  return 0
}
guest_crashes() {
  guest_crash_lines | grep -c .
}
# reboot_vm: a fresh VM of the same build after a crash, the loss put back if it was on
reboot_vm() {
  local lossy=${LOSS_ON:-}
  [ -n "$lossy" ] && loss_off
  start_vm "$VMBUILD" || { say "the VM did not boot again"; return 1; }
  [ -n "$lossy" ] && loss_on
  return 0
}
# accept_race_hint PCAP: for a failed C ABI case, what the capture says if siw left our first
# FPDUs unread: the guest's MPA Reply was its last word on that connection while we had sent
# FPDUs after it (an RTR in peer-to-peer mode, our first Send in client-server mode).
# siw_accept puts the QP's (or the RTR's) receive upcall on the socket only after sending the
# Reply, and what came before stays unread until the next segment; under TCG the guest's
# accept is slow enough for our first FPDU to come first.
accept_race_hint() {
  local d
  d=$("$BIN" decode "$1" 2>/dev/null) || return 0
  awk -v g="$GUEST_SIW" '
    / MPA Reply / && index($3, g ":") == 1 { conn = $5; sent = 0; talk = 0; n++ }
    n && $3 == conn && / iWARP / { sent = 1 }
    n && $5 == conn && / iWARP / { talk = 1 }
    END { exit !(n && sent && !talk) }' <<<"$d" &&
    echo "; siw did not read our first FPDUs after its MPA Reply (the siw_accept race)"
  return 0
}
# tagged_skip_hint PCAP: for a failed C ABI case, whether a tagged message the guest sent (RDMA
# Write, Read Response) left out a DDP segment while the TCP stream has no hole: siw 6.12 sent
# an RDMA Write of 65535 octets without the 1428 at one offset (TCP sequence contiguous, the
# same offset sent in the pings before), which rping -V caught as a data mismatch.
tagged_skip_hint() {
  local d
  d=$("$BIN" decode "$1" 2>&1) || return 0
  grep -q "TCP gap" <<<"$d" && return 0
  GUEST_SIW=$GUEST_SIW python3 -c '
import os, sys
g, nxt = os.environ["GUEST_SIW"] + ":", {}
for line in sys.stdin:
    f = line.split()
    if len(f) < 3 or not f[2].startswith(g) or "STag" not in f or "TO" not in f:
        continue
    if "Write" not in f and "Response" not in f:
        continue
    k, to, n = (f[2], f[f.index("STag") + 1]), int(f[f.index("TO") + 1], 16), int(f[f.index("len") + 1])
    if k in nxt and nxt[k] != to:
        print("; siw left out a DDP segment of a tagged message it sent (%s: offset %#x never sent, frame %s)" % (f[2], nxt[k], f[0]), end="")
        break
    if " L len " in line:
        nxt.pop(k, None)
    else:
        nxt[k] = to + n
' <<<"$d"
  return 0
}
start_vm() {  # BUILD-DIR
  VMBUILD=$1
  "$INTEROP" --stop >/dev/null 2>&1
  say "booting the VM (BUILD=$1)"
  "$INTEROP" --start --build "$1" ${MTU:+--mtu "$MTU"} >/dev/null || { say "VM boot failed"; return 1; }
  VMRUN=$("$INTEROP" --status | sed -n 's/^running: //p')
  [ -n "$VMRUN" ] || { say "no persistent VM after --start"; return 1; }
  # rdma link: "link siw0/1 state ACTIVE physical_state LINK_UP netdev eth1"; else the NIC
  # holding the siw address
  SIWDEV=$(vm_exec "$VMRUN" "rdma link show siw0; ip -o -4 addr show | grep ' inet $GUEST_SIW/'" 20 2>/dev/null |
    sed -n -e 's/.* netdev \([^ ]*\).*/\1/p' -e 's/^[0-9]*: *\([^ ]*\) .*/\1/p' | head -1)
  say "VM up: $VMRUN (siw0 on ${SIWDEV:-?})"
}
# Our client's own capture (--pcap) of the same connection: it decodes strictly and holds the
# messages the bridge saw; its counters match the exchange (3 ULPDUs sent and 4 received per
# ping, MPA startup not counted).
check_own_capture() {
  check_softrdma_client "$1" || return 1
  local own=${1%.log}.own.pcap bridge=${1%.log}.pcap a b
  "$BIN" decode --strict "$own" >"${1%.log}.own.decode" 2>&1 ||
    { echo "decode --strict of our own capture $own failed"; return 1; }
  a=$(tail -1 "${1%.log}.own.decode" | sed -n 's/.* \([0-9]*\) messages.*/\1/p')
  # The summary line goes to standard error.
  b=$("$BIN" decode "$bridge" 2>&1 >/dev/null | tail -1 | sed -n 's/.* \([0-9]*\) messages.*/\1/p')
  # A segment the bridge lost takes every message in it along.
  [ -n "$a" ] && [ -n "$b" ] && { [ "$a" = "$b" ] || fewer_by_drops "$(basename "${1%.log}")" "$a" "$b" "$(case_drops "$1")" 0; } ||
    { echo "our capture has $a messages, the bridge's $b"; return 1; }
  grep -qE "^  tx_units +$((3 * COUNT))\$" "$1" || { echo "QP tx_units is not $((3 * COUNT))"; return 1; }
  grep -qE "^  rx_units +$((4 * COUNT))\$" "$1" || { echo "QP rx_units is not $((4 * COUNT))"; return 1; }
}
# section LOG guest|host: that side's output in an interop.sh log
section() {
  awk -v want="=== $2 " 'index($0, "=== ") == 1 { on = (index($0, want) == 1); next } on' "$1"
}
# between START END: the lines of standard input after the line START, up to the one starting
# with END (the markers the kill/reset commands print)
between() { awk -v a="$1" -v b="$2" 'index($0, b) == 1 { on = 0 } on; $0 == a { on = 1 }'; }

# ---- loss: both directions of the siw connection ----------------------------------------
# The host kernel lacks sch_netem, so netem goes on the guest's siw netdev (eth1 when the VM
# has two NICs; eth0 carries rxe): guest -> host. Host -> guest is an nft rule in the
# namespace's output hook (softrdma's TCP leaves through it), counting what it drops.
VMRUN="" SIWDEV="" LOSS_ON=""
loss_on() {
  [ -n "$SIWDEV" ] || { say "the guest's siw netdev is unknown"; return 1; }
  net_loss_on "$VMRUN" "$SIWDEV" "$GUEST_SIW" "$LOSS" "meta l4proto tcp" && LOSS_ON=1
}
loss_off() { net_loss_off "$VMRUN" "$SIWDEV"; LOSS_ON=""; }
# loss_counts: "GUEST->HOST HOST->GUEST" packets the loss dropped so far, so each lossy case
# can show the loss it met.
loss_counts() { net_loss_counts "$VMRUN" "$SIWDEV"; }

lossy_names() {
  local s t
  for s in $LOSSY_SIZES; do echo "lossy-rping-c-S$s"; echo "lossy-rping-s-S$s"; done
  if [ "$PERFTEST" = 1 ]; then
    for t in ib_write_bw ib_read_bw ib_send_bw; do echo "lossy-$t-R"; done
    for t in write read; do echo "lossy-ib_${t}_bw-R-guest-server"; done
  fi
  [ "$CAPI" = 1 ] && echo "capi-lossy-rping-c-S65535"
}
any_selected() { local n; for n in "$@"; do selected "$n" && return 0; done; return 1; }

# The rping and perftest cases again under loss: LOSSY_COUNT pings of each of LOSSY_SIZES,
# every one verified; perftest's result lines as without loss.
lossy_cases() {
  # shellcheck disable=SC2046
  any_selected $(lossy_names) || return 0
  command -v nft >/dev/null 2>&1 ||
    { record "lossy (${LOSS}%)" 0 "no nft on this host: no host -> guest loss (apt-get install -y nftables)"; return; }
  if ! loss_on; then record "lossy (${LOSS}%)" 0 "could not set up the loss"; return; fi
  say "loss ${LOSS}% both ways (netem on the guest's $SIWDEV, nft in $NS)"
  local sizes=$SIZES count=$COUNT rt=$RPING_TIMEOUT pt=$PERF_TIMEOUT
  SIZES=$LOSSY_SIZES COUNT=$LOSSY_COUNT RPING_TIMEOUT=$LOSSY_TIMEOUT PERF_TIMEOUT=$LOSSY_TIMEOUT
  rping_cases "lossy-" "softrdma_"
  [ "$PERFTEST" = 1 ] && perftest_cases "lossy-" 65536
  # Debian's rping on softrdma (the C ABI) under the same loss.
  SIZES=65535
  [ "$CAPI" = 1 ] && capi_rping_cases "capi-lossy-"
  SIZES=$sizes COUNT=$count RPING_TIMEOUT=$rt PERF_TIMEOUT=$pt
  loss_off
}

# ---- kill / reset: the Linux peer goes away in the middle --------------------------------
# After it, our side must have ended that connection with flushed (or failed) work requests,
# neither waiting for its progress timeout (a hang) nor panicking; a new connection then
# works. rping is lock-step, so stopping after KILL_AFTER pings lands in the middle of one;
# perftest is stopped after KILL_BYTES octets went through the guest's siw NIC.
#   kill:  the guest's first peer gets SIGKILL (siw then closes the connection).
#   reset: an nft rule in the host namespace answers our next segment of that one connection
#          (its port pair) with an RST, as from the guest (reject with tcp reset; the guest
#          image has no inet_diag, so `ss -K` cannot do it there); our kernel then answers
#          the guest's next segment with an RST of its own. The guest's peer may stay
#          half-open: the host drops FIRST-DONE into the VM's run directory once our side is
#          done, and the guest then kills it.
KILL_PINGS=5 KILL_SIZE=4096 KILL_BYTES=$((4 << 20))
# perftest's first run: 512 MiB, far more than KILL_BYTES, and bounded should the kill miss it
KILL_ITERS=8000
# What our rping may say about the first connection: the flushed receive, a completion in
# error, or a post refused by the QP in error.
RPING_ENDED='the peer disconnected|cq completion failed|not possible in QP state'
RESET_TABLE=softrdma_siw_reset

# Guest sh: is process $1 running? (kill -0 also holds for a zombie that busybox sh has not
# reaped yet.) Builtins only, here and in the other polling loops: forks are slow under TCG
# while siw runs flat out, and a starved loop stops the peer too late.
G_ALIVE='alive() { { read -r s < /proc/$1/stat; } 2>/dev/null && set -- $s && [ "$3" != Z ]; }'
# g_await_lines FILE REGEX N: guest sh waiting (at most 120 s) until FILE has N lines matching
# REGEX, or the first peer ($p) is gone
g_await_lines() {
  echo "i=0; while [ \$(grep -cE '$2' $1) -lt $3 ] && alive \$p && [ \$i -lt 1200 ]; do sleep 0.1; i=\$((i + 1)); done"
}
# g_bytes_base: guest sh defining nic(), which sets B to the octets through the guest's siw
# NIC since now (ss -i shows no counters there: the image has no inet_diag)
g_bytes_base() {
  local n=/sys/class/net/$SIWDEV/statistics
  echo "nic() { read -r a < $n/rx_bytes; read -r b < $n/tx_bytes; B=\$((a + b - base)); }; base=0; nic; base=\$B"
}
# g_await_bytes: guest sh waiting (at most 120 s) until KILL_BYTES went through, or the
# first peer ($p) is gone
g_await_bytes() {
  echo "i=0; while nic; [ \$B -lt $KILL_BYTES ] && alive \$p && [ \$i -lt 1200 ]; do sleep 0.1; i=\$((i + 1)); done"
}
G_KILL='kill -KILL $p; wait $p; echo "--- first peer rc $?"'
# g_after_reset NAME: the guest waits for the host's FIRST-DONE, then ends its first peer
g_after_reset() {
  cat <<EOF
vm-wait-host $1.first-done 200 || echo '--- the host did not report its first connection done'
if alive \$p; then kill -KILL \$p; echo '--- the first peer was still running (half-open): killed'; fi
wait \$p; echo "--- first peer rc \$?"
EOF
}
# h_await FILE REGEX N LIMIT: host bash waiting (LIMIT tenths of a second at most) until FILE
# has N lines matching REGEX, or our process ($p) is gone
h_await() {
  echo "i=0; while [ \$(grep -cE '$2' $1) -lt $3 ] && kill -0 \$p 2>/dev/null && [ \$i -lt $4 ]; do sleep 0.1; i=\$((i + 1)); done"
}
# h_end_first OUT: host bash after h_await of our first client's last line: a client that
# never said it ended in that time is hung (killed); one that said so gets 10 s to exit, as
# tearing down takes a moment (killed past that too, with its own message).
h_end_first() {
  cat <<EOF
echo "--- waited \$i tenths of a second for our first client's last line"
if [ \$(grep -cE '^rping client' $1) -lt 1 ]; then
  kill -0 \$p 2>/dev/null && { echo '--- our first client still runs 60 s after the reset: killed'; kill -KILL \$p; }
else
  i=0; while kill -0 \$p 2>/dev/null && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i + 1)); done
  kill -0 \$p 2>/dev/null && { echo '--- our first client still runs 10 s after it ended: killed'; kill -KILL \$p; }
fi
EOF
}
# h_reset NAME SPORT DPORT COUNT-FILE: host bash adding the reset rule for our segments from
# SPORT to the guest's DPORT (one of them found with ss), and saying so
h_reset() {
  local g=${GUEST_SIW//./\\.} h=${HOST_SIW//./\\.} find
  if [ "$2" = ours ]; then
    find="port=\$(ss -Htn dst $GUEST_SIW dport = :$3 | grep -oE '$h:[0-9]+' | head -1 | cut -d: -f2)"
    set -- "$1" "\$port" "$3" "$4"
  else
    find="port=\$(ss -Htn dst $GUEST_SIW sport = :$2 | grep -oE '$g:[0-9]+' | head -1 | cut -d: -f2)"
    set -- "$1" "$2" "\$port" "$4"
  fi
  cat <<EOF
$find
echo "--- resetting the first connection (port \${port:-?}) after \$(grep -c '$4' $1) pings"
nft add table inet $RESET_TABLE
nft add chain inet $RESET_TABLE out '{ type filter hook output priority 0; }'
nft add rule inet $RESET_TABLE out ip daddr $GUEST_SIW tcp sport $2 tcp dport $3 'tcp flags & rst == 0' counter reject with tcp reset
EOF
}
# h_reset_done NAME: host bash reporting the RSTs the rule sent us, dropping it, and telling
# the guest
h_reset_done() {
  cat <<EOF
echo "--- reset rule: \$(nft list table inet $RESET_TABLE | grep -oE 'counter packets [0-9]+')"
nft delete table inet $RESET_TABLE
touch $VMRUN/$1.first-done
EOF
}
reset_cleanup() {  # NAME: what a reset case killed at its timeout may have left
  H nft delete table inet "$RESET_TABLE" 2>/dev/null
  [ -n "$VMRUN" ] && rm -f "$VMRUN/$1.first-done"
  return 0
}

# The guest's rping server stopped; our client made the first connection to it and makes a
# second to the guest's other server on 7175 (listening from the start).
rping_stop_server_case() {  # NAME kill|reset
  selected "$1" || return 0
  local f=/tmp/$1 o=$OUT/$1.first.out host stop
  if [ "$2" = kill ]; then
    host="echo '--- first connection'
$BIN rping -c -a $GUEST_SIW -C 1000000 -S $KILL_SIZE -V -d --timeout 30
echo \"--- first rc \$?\""
    stop="$(g_await_lines "$f.first" '^server ping data' "$KILL_AFTER")
echo \"--- stopping the first server after \$(grep -c '^server ping data' $f.first) pings\"
$G_KILL"
  else
    host=": > $o; $BIN rping -c -a $GUEST_SIW -C 1000000 -S $KILL_SIZE -V -v -d --timeout 30 > $o 2>&1 & p=\$!
$(h_await "$o" '^ping data' "$KILL_AFTER" 1200)
$(h_reset "$o" ours 7174 '^ping data')
$(h_await "$o" '^rping client' 1 600)
$(h_end_first "$o")
wait \$p; rc=\$?
$(h_reset_done "$1")
echo '--- first connection'; grep -v '^ping data' $o; echo \"--- first rc \$rc\""
    stop=$(g_after_reset "$1")
  fi
  reset_cleanup "$1"
  run_case "$1" "check_stopped_rping_server" --guest-first --wait-port 7174 --timeout 300 \
    --guest "$G_ALIVE
rping -s -a $GUEST_SIW -p 7175 -S $KILL_SIZE -V -v > $f.second 2>&1 & q=\$!
vm-wait-listen 7175 30 || echo '--- the second server does not listen'
: > $f.first; rping -s -a $GUEST_SIW -S $KILL_SIZE -V -v > $f.first 2>&1 & p=\$!
$stop
grep -v '^server ping data' $f.first | sed 's/^/first: /'
wait \$q; r=\$?; echo '--- second server'; cat $f.second; echo \"--- second server rc \$r\"; exit \$r" \
    --host "$host
echo '--- second connection'
$BIN rping -c -a $GUEST_SIW -p 7175 -C $KILL_PINGS -S $KILL_SIZE -V -v -d
echo \"--- second rc \$?\""
  reset_cleanup "$1"
}
# The guest's rping client stopped; our persistent server served it and serves a second one.
rping_stop_client_case() {  # NAME kill|reset
  selected "$1" || return 0
  local f=/tmp/$1 o=$OUT/$1.server.out reset="" stop
  if [ "$2" = kill ]; then
    stop="$(g_await_lines "$f.first" '^ping data' "$KILL_AFTER")
echo \"--- stopping the first client after \$(grep -c '^ping data' $f.first) pings\"
$G_KILL"
  else
    reset="$(h_await "$o" '^server ping data' "$KILL_AFTER" 1200)
$(h_reset "$o" 7174 theirs '^server ping data')
$(h_await "$o" '^(server: |rping server failed)' 1 600)
$(h_reset_done "$1")"
    stop=$(g_after_reset "$1")
  fi
  reset_cleanup "$1"
  run_case "$1" "check_stopped_rping_client" --host-first --wait-port 7174 --timeout 300 \
    --host ": > $o; $BIN rping -s -P -a $HOST_SIW -S $KILL_SIZE -V -v -d --timeout 30 > $o 2>&1 & p=\$!
$reset
# Two sessions ended (or the server is gone).
$(h_await "$o" '^(server: |rping server failed)' 2 2200)
if kill -0 \$p 2>/dev/null; then kill \$p; wait \$p; echo '--- server stopped'; else wait \$p; echo \"--- server exited by itself, rc \$?\"; fi
cat $o" \
    --guest "$G_ALIVE
: > $f.first; rping -c -a $HOST_SIW -C 1000000 -S $KILL_SIZE -V -v > $f.first 2>&1 & p=\$!
$stop
grep -v '^ping data' $f.first | sed 's/^/first: /'
echo '--- second client'
rping -c -a $HOST_SIW -C $KILL_PINGS -S $KILL_SIZE -V -v; r=\$?
echo \"--- second client rc \$r\"; exit \$r"
  reset_cleanup "$1"
}
# Guest ib_write_bw -R client killed mid-transfer; our perftest server's session ends, and a
# second server (port 18516, up from the start) serves a whole session.
perf_kill_client_case() {  # NAME
  local f=/tmp/$1 o=$OUT/$1.second.out
  run_case "$1" check_killed_perf_client --host-first --wait-port 18515 --timeout 300 \
    --host "$BIN perf --server --perftest -B $HOST_SIW -p 18516 > $o 2>&1 & q=\$!
i=0; until ss -Hltn 'sport = :18516' | grep -q . || [ \$i -ge 300 ]; do sleep 0.1; i=\$((i + 1)); done
echo '--- first session'
$BIN perf --server --perftest -B $HOST_SIW -p 18515
echo \"--- first rc \$?\"
wait \$q; r=\$?; echo '--- second session'; cat $o; echo \"--- second rc \$r\"" \
    --guest "$G_ALIVE
$(g_bytes_base)
ib_write_bw -d siw0 -R -F -s 65536 -n $KILL_ITERS $HOST_SIW > $f.first 2>&1 & p=\$!
$(g_await_bytes)
nic; echo \"--- stopping the first client after \$B octets\"
$G_KILL
echo '--- second client'
ib_write_bw -d siw0 -R -F -s 65536 -n 200 -p 18516 $HOST_SIW; r=\$?
echo \"--- second client rc \$r\"; exit \$r"
}
# Guest ib_write_bw -R server killed mid-transfer; our client fails, then runs a whole test
# against the guest's second server (18516).
perf_kill_server_case() {  # NAME
  local f=/tmp/$1
  run_case "$1" check_killed_perf_server --guest-first --wait-port 18515 --timeout 300 \
    --guest "$G_ALIVE
ib_write_bw -d siw0 -R -F -s 65536 -n 200 -p 18516 > $f.second 2>&1 & q=\$!
vm-wait-listen 18516 30 || echo '--- the second server does not listen'
$(g_bytes_base)
ib_write_bw -d siw0 -R -F -s 65536 -n $KILL_ITERS > $f.first 2>&1 & p=\$!
$(g_await_bytes)
nic; echo \"--- stopping the first server after \$B octets\"
$G_KILL
wait \$q; r=\$?; echo '--- second server'; cat $f.second
$(g_close_race "$f.second")
echo \"--- second server rc \$r\"; exit \$r" \
    --host "echo '--- first connection'
$BIN perf --perftest -R --test write -p 18515 -s 65536 -n $KILL_ITERS $GUEST_SIW
echo \"--- first rc \$?\"
echo '--- second connection'
$BIN perf --perftest -R --test write -p 18516 -s 65536 -n 200 $GUEST_SIW
echo \"--- second rc \$?\""
}

kill_cases() {
  rping_stop_server_case kill-rping-guest-server kill
  rping_stop_client_case kill-rping-guest-client kill
  rping_stop_server_case reset-rping-guest-server reset
  rping_stop_client_case reset-rping-guest-client reset
  if [ "$PERFTEST" = 1 ]; then
    perf_kill_client_case kill-ib_write_bw-R-guest-client
    perf_kill_server_case kill-ib_write_bw-R-guest-server
  fi
}

# Checks of the kill/reset cases. They hold each side's output in a variable: under pipefail,
# `section | grep -q` fails when grep stops reading early (awk then dies of SIGPIPE).
check_stopped_at() {  # LOG pings|octets: the first peer was stopped in the middle
  local n min=$KILL_AFTER h g
  [ "$2" = octets ] && min=$KILL_BYTES
  h=$(section "$1" host); g=$(section "$1" guest)
  if [[ "$1" == */reset-* ]]; then
    n=$(sed -n "s/^--- resetting the first connection (port [0-9][0-9]*) after \([0-9]*\) $2\$/\1/p" <<<"$h")
    [ -n "$n" ] || { echo "our side did not reset the first connection: $(grep -m1 '^--- resetting' <<<"$h" || echo 'no report')"; return 1; }
    grep -qE '^--- reset rule: counter packets [1-9]' <<<"$h" ||
      { echo "the reset rule sent us no RST: $(grep -m1 '^--- reset rule' <<<"$h")"; return 1; }
    grep -q '^--- first peer rc ' <<<"$g" || { echo "the guest's first peer did not end"; return 1; }
  else
    n=$(sed -n "s/^--- stopping the first .* after \([0-9]*\) $2\$/\1/p" <<<"$g")
    [ -n "$n" ] || { echo "the guest did not stop its first peer"; return 1; }
    # 137: SIGKILL; a peer that had ended by itself was not killed in the middle.
    grep -q '^--- first peer rc 137$' <<<"$g" ||
      { echo "the guest's first peer was not killed: $(grep -m1 '^--- first peer rc' <<<"$g" || echo 'no status')"; return 1; }
  fi
  [ "$n" -ge "$min" ] || { echo "the first connection ended before $min $2 ($n)"; return 1; }
}
no_crash() {  # LOG
  local h; h=$(section "$1" host)
  ! grep -qE 'panicked|Segmentation fault|Aborted' <<<"$h" ||
    { echo "softrdma crashed: $(grep -m1 -E 'panicked|Segmentation fault|Aborted' <<<"$h")"; return 1; }
}
check_first_client_ended() {  # LOG ERROR-REGEX: our first client failed as it should, not by timeout
  local h first rc
  h=$(section "$1" host)
  first=$(between '--- first connection' '--- first rc ' <<<"$h")
  rc=$(sed -n 's/^--- first rc //p' <<<"$h")
  [ -n "$rc" ] || { echo "our first client did not end"; return 1; }
  ! grep -q '^--- our first client still runs 60 s' <<<"$h" || { echo "our first client hung after the reset"; return 1; }
  ! grep -q '^--- our first client still runs 10 s' <<<"$h" || { echo "our first client hung after it ended"; return 1; }
  [ "$rc" != 0 ] || { echo "our first client ended without an error"; return 1; }
  ! grep -qiE 'timed out|timeout' <<<"$first" ||
    { echo "our first client hung until a timeout: $(grep -m1 -iE 'timed out|timeout' <<<"$first")"; return 1; }
  grep -qE "$2" <<<"$first" || { echo "our first client failed otherwise: $(tail -1 <<<"$first")"; return 1; }
}
check_stopped_rping_server() {  # LOG
  no_crash "$1" || return 1
  check_stopped_at "$1" pings || return 1
  check_first_client_ended "$1" "rping client failed: ($RPING_ENDED)" || return 1
  local second
  second=$(section "$1" host | between '--- second connection' '--- second rc ')
  grep -q "client: $KILL_PINGS pings, $KILL_PINGS verified" <<<"$second" ||
    { echo "our second client did not verify $KILL_PINGS pings: $(tail -1 <<<"$second")"; return 1; }
}
check_stopped_rping_client() {  # LOG
  no_crash "$1" || return 1
  check_stopped_at "$1" pings || return 1
  local h ends first g
  h=$(section "$1" host)
  grep -q '^--- server stopped' <<<"$h" ||
    { echo "our server did not keep running: $(grep '^--- server exited' <<<"$h")"; return 1; }
  ends=$(grep -E '^(server: |rping server failed)' <<<"$h")
  [ "$(grep -c . <<<"$ends")" = 2 ] || { echo "our server ended $(grep -c . <<<"$ends") sessions, not 2"; return 1; }
  first=$(head -1 <<<"$ends")
  grep -qE "^server: [0-9]+ pings|rping server failed: ($RPING_ENDED)" <<<"$first" ||
    { echo "our server's first session ended otherwise: $first"; return 1; }
  [ "$(tail -1 <<<"$ends")" = "server: $KILL_PINGS pings, $KILL_PINGS verified" ] ||
    { echo "our server's second session: $(tail -1 <<<"$ends")"; return 1; }
  g=$(section "$1" guest | between '--- second client' '--- second client rc ')
  [ "$(grep -c '^ping data: rdma-ping-' <<<"$g")" = "$KILL_PINGS" ] ||
    { echo "the guest's second client printed $(grep -c '^ping data: rdma-ping-' <<<"$g") of $KILL_PINGS pings"; return 1; }
}
PERF_RESULT='^ *65536[[:space:]]+200[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+'
check_killed_perf_client() {  # LOG: our first session ended (no hang, no crash), the second is whole
  no_crash "$1" || return 1
  check_stopped_at "$1" octets || return 1
  local h first second g
  h=$(section "$1" host)
  grep -q '^--- first rc ' <<<"$h" || { echo "our first perftest server did not end"; return 1; }
  first=$(between '--- first session' '--- first rc ' <<<"$h")
  ! grep -qiE 'timed out|timeout' <<<"$first" || { echo "our first perftest server hung until a timeout"; return 1; }
  second=$(between '--- second session' '--- second rc ' <<<"$h")
  grep -q 'perftest session done' <<<"$second" || { echo "our second perftest server did not finish its session"; return 1; }
  g=$(section "$1" guest | between '--- second client' '--- second client rc ')
  grep -qE "$PERF_RESULT" <<<"$g" || { echo "the guest's second client printed no result line"; return 1; }
}
check_killed_perf_server() {  # LOG: our first client failed (no hang, no crash), the second test is whole
  no_crash "$1" || return 1
  check_stopped_at "$1" octets || return 1
  check_first_client_ended "$1" '.' || return 1
  local h g
  h=$(section "$1" host | between '--- second connection' '--- second rc ')
  grep -qE "$PERF_RESULT" <<<"$h" || { echo "our second client printed no result line"; return 1; }
  g=$(section "$1" guest | between '--- second server' '--- second server rc ')
  grep -qE "$PERF_RESULT" <<<"$g" || { echo "the guest's second server printed no result line"; return 1; }
}

# ---- the C ABI: Debian's programs on softrdma (softrdma run --transport iwarp) -------------
CAPI_DEV=softrdma_tcp0
CAPI_RUN="$BIN run --transport iwarp --"
# The C ABI's rping checks are interop-lib.sh's (count_o, check_capi_rping_c/_s); the pings
# each side must print:
capi_pings() { echo "$COUNT"; }
CAPI_PERF_SIZE=65536
check_capi_perf() {  # both perftests printed the result line for CAPI_PERF_SIZE octets x 200
  local side
  for side in guest host; do
    section "$1" $side | grep -qE "^ *$CAPI_PERF_SIZE[[:space:]]+200[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+" ||
      { echo "no result line for $CAPI_PERF_SIZE octets x 200 from the $side"; return 1; }
  done
}

# nudge_seen PCAP write: our side sent its zero-length nudge (a Write of nothing to STag 0)
# on one of the case's connections (`read`: a Read Request of size 0 naming STag 0, which
# our side no longer sends).
nudge_seen() {
  local pat='RDMA Write STag 0x00000000 TO 0x0 L len 0$'
  [ "$2" = read ] && pat='RDMA Read Request .* sink 0x00000000/0x0 size 0 src 0x00000000/0x0$'
  # The decode is held in a variable: a `grep -q` that quits at an early match would end
  # the pipe with SIGPIPE, which pipefail counts as a failure.
  local ours
  ours=$("$BIN" decode "$1" 2>/dev/null | awk -v h="$HOST_SIW:" 'index($3, h) == 1')
  grep -qE "$pat" <<<"$ours" || { echo "no zero-length $2 nudge from our side in $1"; return 1; }
}
check_nudge_rping() { check_softrdma_client "$1" && nudge_seen "${1%.log}.pcap" write; }
check_nudge_capi_perf() { check_capi_perf "$1" && nudge_seen "${1%.log}.pcap" write; }

capi_rping_cases() {  # CASE-PREFIX
  local p=$1 s
  for s in $SIZES; do
    run_case "${p}rping-c-S$s" check_capi_rping_c --guest-first --wait-port 7174 --timeout "$RPING_TIMEOUT" \
      --guest "rping -s -a $GUEST_SIW -C $COUNT -S $s -V -v" \
      --host "$CAPI_RUN rping -c -a $GUEST_SIW -C $COUNT -S $s -V -v"
    [[ "$p" == *lossy* ]] && continue     # under loss: the client role only
    run_case "${p}rping-s-S$s" check_capi_rping_s --host-first --wait-port 7174 --timeout "$RPING_TIMEOUT" \
      --host "$CAPI_RUN rping -s -a $HOST_SIW -C $COUNT -S $s -V -v" \
      --guest "rping -c -a $HOST_SIW -C $COUNT -S $s -V -v"
  done
}
# perftest -R both ways: the host (Debian perftest on softrdma_tcp0) as server vs the guest's
# client, and as client vs the guest's server. perftest's -R client connects its data QP as
# soon as the control exchange ends, racing the server's second rdma_listen: the C ABI tries a
# refused connect again over 75 ms (--no-capi-host-clients leaves the host-client cases out).
capi_perf_cases() {
  local t z role
  for t in ib_write_bw ib_read_bw ib_send_lat; do
    z=65536; [ "$t" = ib_send_lat ] && z=2
    CAPI_PERF_SIZE=$z
    # The guest client can meet siw's close race too (its last record, our server closing).
    run_case "capi-$t-R-host-server" check_capi_perf --host-first --wait-port 18515 --timeout "$PERF_TIMEOUT" \
      --host "$CAPI_RUN $t -d $CAPI_DEV -R -F -s $z -n 200 -p 18515" \
      --guest "$t -d siw0 -R -F -s $z -n 200 -p 18515 $HOST_SIW > /tmp/pcli.out 2>&1; r=\$?; cat /tmp/pcli.out
$(g_close_race /tmp/pcli.out); exit \$r"
    [ "$CAPI_HOST_CLIENTS" = 1 ] || continue
    run_case "capi-$t-R-guest-server" check_capi_perf --guest-first --wait-port 18515 --timeout "$PERF_TIMEOUT" \
      --guest "$t -d siw0 -R -F -s $z -n 200 -p 18515 > /tmp/psrv.out 2>&1; r=\$?; cat /tmp/psrv.out
$(g_close_race /tmp/psrv.out); exit \$r" \
      --host "$CAPI_RUN $t -d $CAPI_DEV -R -F -s $z -n 200 -p 18515 $GUEST_SIW"
  done
  CAPI_PERF_SIZE=65536
}
capi_cases() {
  local sizes=$SIZES
  SIZES=$CAPI_RPING_SIZES
  capi_rping_cases "capi-"
  SIZES=$sizes
  [ "$PERFTEST" = 1 ] && capi_perf_cases
}

trap 'loss_off; H nft delete table inet "$RESET_TABLE" 2>/dev/null; "$INTEROP" --stop >/dev/null 2>&1' EXIT

# siw as Debian builds it: CRC only if the peer asks.
if start_vm "$STATE/build"; then
  rping_cases "" "softrdma_"
  # We ask for CRC: siw must turn it on (RFC 5044 §7.1.2: CRC on if either side asks).
  run_case "rping-c-S4096-crc-asked" check_crc_client --guest-first --wait-port 7174 --timeout 120 \
    --guest "rping -s -a $GUEST_SIW -C $COUNT -S 4096 -V -v" \
    --host "$BIN rping -c -a $GUEST_SIW -C $COUNT -S 4096 -V -v -d --crc"
  run_case "rping-c-S1000-own-pcap" check_own_capture --guest-first --wait-port 7174 --timeout 120 \
    --guest "rping -s -a $GUEST_SIW -C $COUNT -S 1000 -V -v" \
    --host "$BIN rping -c -a $GUEST_SIW -C $COUNT -S 1000 -V -v -d --counters --pcap $OUT/rping-c-S1000-own-pcap.own.pcap"
  # The nudge on every connection (SOFTRDMA_NUDGE_AFTER_MS=0): siw takes it.
  run_case "nudge-rping-c-S64" check_nudge_rping --guest-first --wait-port 7174 --timeout 120 \
    --guest "rping -s -a $GUEST_SIW -C $COUNT -S 64 -V -v" \
    --host "SOFTRDMA_NUDGE_AFTER_MS=0 $BIN rping -c -a $GUEST_SIW -C $COUNT -S 64 -V -v -d"
  [ "$PERFTEST" = 1 ] && perftest_cases
  [ "$CAPI" = 1 ] && capi_cases
  [ "$CAPI" = 1 ] && [ "$PERFTEST" = 1 ] &&
    run_case "nudge-capi-ib_write_bw-R-guest-server" check_nudge_capi_perf --guest-first --wait-port 18515 --timeout "$PERF_TIMEOUT" \
      --guest "ib_write_bw -d siw0 -R -F -s 65536 -n 200 -p 18515 > /tmp/psrv.out 2>&1; r=\$?; cat /tmp/psrv.out
$(g_close_race /tmp/psrv.out); exit \$r" \
      --host "SOFTRDMA_NUDGE_AFTER_MS=0 $CAPI_RUN ib_write_bw -d $CAPI_DEV -R -F -s 65536 -n 200 -p 18515 $GUEST_SIW"
  [ "$KILL" = 1 ] && kill_cases
  [ "$LOSSY" = 1 ] && lossy_cases
else
  record "boot (default siw)" 0 "the VM did not boot"
fi

# siw built with SIW_MPA_CRC=1: CRC required. No boot when --only leaves none of its cases.
crc_names() { local s; for s in $SIZES; do echo "crc-rping-c-S$s"; echo "crc-rping-s-S$s"; done; }
# shellcheck disable=SC2046
if [ "$CRC" = 1 ] && any_selected $(crc_names); then
  CRCBUILD=$STATE/build-crc
  if [ ! -e "$CRCBUILD/vmlinuz" ]; then
    say "building the SIW_MPA_CRC=1 image in $CRCBUILD (about 30 s)"
    SIW_MPA_CRC=1 BUILD=$CRCBUILD "$VMDIR/build-image.sh" >"$OUT/build-crc.log" 2>&1 ||
      record "build SIW_MPA_CRC=1 image" 0 "build-image.sh failed (log $OUT/build-crc.log)"
  fi
  if [ -e "$CRCBUILD/vmlinuz" ] && start_vm "$CRCBUILD"; then
    # siw with SIW_MPA_CRC=1 asks for CRC as initiator, but as responder it answers a
    # Request without C with C=0 (siw_cm.c siw_proc_mpareq only forces C on when the
    # initiator asked), so our client asks (--crc) to run these cases with CRC on.
    rping_cases "crc-" "crc_" --crc
  else
    record "boot (SIW_MPA_CRC=1)" 0 "the VM did not boot"
  fi
fi

echo
echo "interop-siw: $PASSED passed, $FAILED failed (logs and pcaps in $OUT)"
printf '%s\n' "${RESULTS[@]}"
[ ${#NOTES[@]} = 0 ] || { echo "notes:"; printf '  %s\n' "${NOTES[@]}"; }
[ "$FAILED" = 0 ]
