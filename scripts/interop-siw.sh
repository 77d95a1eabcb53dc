#!/usr/bin/env bash
# interop-siw.sh - softrdma against the Linux kernel's siw (issue 3, Done-when 4).
#
# Builds `softrdma` (release) and runs interop cases through ../shared/interop-vm/interop.sh,
# one persistent VM per siw build: the guest (10.77.1.2 = siw0) runs Linux rping / perftest,
# the host side (namespace rdmavm, 10.77.1.1) runs softrdma.
#
#   rping-c-S<size>        softrdma rping -c  vs  guest rping -s   (-C 10 -S size -V)
#   rping-s-S<size>        guest rping -c     vs  softrdma rping -s (-C 10 -S size -V)
#   ib_{write,read,send}_bw  guest ib_*_bw -R  vs  softrdma perf --server --perftest
#   ib_{write,read}_bw-R-guest-server  guest ib_*_bw -R server  vs  softrdma perf --perftest -R
#   rping-c-S1000-own-pcap our client's own --pcap capture decodes strictly, holds the
#                          messages the bridge saw, and its --counters match the exchange
#   crc-...                the rping cases again against siw built with SIW_MPA_CRC=1
#
# Each case's bridge capture is decoded with `softrdma decode --strict`. Prints PASS/FAIL per
# case and a summary; exits 0 only if every case passed. Needs root and /dev/net/tun (the VM's
# network namespace and taps); takes a few minutes under TCG.
#
# Options: --sizes "26 64 ..."  --count N  --no-crc  --no-perftest  --no-build
#          --only REGEX (case names)  --out DIR (logs and pcaps; default target/interop-siw)
#          --mtu N (the VM's NIC and the bridge, e.g. 9000: jumbo frames, larger FPDUs)
#          --rx-direct-min N (softrdma reads payloads of N octets and more straight into
#          registered memory; the default, 16384, is above siw's FPDUs over this link, so
#          `--rx-direct-min 1` is how the direct receive path meets siw)
# Environment: SOFTRDMA_BIN (default target/release/softrdma; --no-build implied if set)
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VMDIR=${INTEROP_VM_DIR:-$(dirname "$0")/../../shared/interop-vm}
VMDIR=$(cd "$VMDIR" && pwd)
# only_capture_gaps (the rest of it is redefined below, as this script keeps its own books).
. "$REPO/scripts/interop-lib.sh"
STATE=${INTEROP_VM_STATE:-/var/tmp/interop-vm}
# rping accepts -S 26..65535 (RPING_MIN_BUFSIZE .. RPING_BUFSIZE - 1).
SIZES="26 64 1000 4096 65535"
COUNT=10
CRC=1 PERFTEST=1 BUILD_BIN=1 MTU=""
OUT=$REPO/target/interop-siw
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) SIZES=$2; shift ;;
    --count) COUNT=$2; shift ;;
    --no-crc) CRC=0 ;;
    --no-perftest) PERFTEST=0 ;;
    --no-build) BUILD_BIN=0 ;;
    --only) ONLY=$2; shift ;;
    --out) OUT=$2; shift ;;
    --mtu) MTU=$2; shift ;;
    --rx-direct-min) export SOFTRDMA_RX_DIRECT_MIN=$2; shift ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 0 ;;
    *) echo "interop-siw.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

[ "$(id -u)" = 0 ] || { echo "interop-siw.sh: needs root (network namespace, taps)" >&2; exit 2; }
[ -c /dev/net/tun ] || { echo "interop-siw.sh: needs /dev/net/tun" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=${SOFTRDMA_BIN:-$REPO/target/release/softrdma}
if [ "$BUILD_BIN" = 1 ] && [ -z "${SOFTRDMA_BIN:-}" ]; then
  (cd "$REPO" && cargo build --release -p softrdma-cli) || exit 1
fi
[ -x "$BIN" ] || { echo "interop-siw.sh: no $BIN" >&2; exit 2; }
# interop.sh --start writes its boot log under runs/ without creating it.
mkdir -p "$STATE/runs"

INTEROP=$VMDIR/interop.sh
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
  local log=$OUT/$1.decode dir dropped
  if "$BIN" decode --strict "$2" >"$log" 2>&1; then
    say "$1: decode --strict ok ($(tail -1 "$log"))"
    return 0
  fi
  dir=$(sed -n 's/.*logs in \(.*\)$/\1/p' "$3" | tail -1)
  dropped=$(sed -n 's/^\([0-9]*\) packets\? dropped by kernel/\1/p' "$dir/tcpdump.log" 2>/dev/null)
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
  if [ -z "$why" ]; then record "$name" 1 ""; else record "$name" 0 "$why (log $log)"; fi
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
    run_case "${p}rping-c-S$s" "check_${c}client" --guest-first --wait-port 7174 --timeout 120 \
      --guest "rping -s -a $GUEST_SIW -C $COUNT -S $s -V -v" \
      --host "$BIN rping -c -a $GUEST_SIW -C $COUNT -S $s -V -v -d $x"
    run_case "${p}rping-s-S$s" "check_${c}server" --host-first --wait-port 7174 --timeout 120 \
      --host "$BIN rping -s -a $HOST_SIW -C $COUNT -S $s -V -v -d" \
      --guest "rping -c -a $HOST_SIW -C $COUNT -S $s -V -v"
  done
}

check_perftest_client() {  # both printed a result line for 65536 octets x 200
  local side
  for side in guest host; do
    awk -v want="=== $side " 'index($0, "=== ") == 1 { on = (index($0, want) == 1); next } on' "$1" |
      grep -qE '^ *65536[[:space:]]+200[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+' ||
      { echo "no result line from the $side"; return 1; }
  done
}

perftest_cases() {
  local t
  for t in ib_write_bw ib_read_bw ib_send_bw; do
    run_case "$t-R" check_perftest --host-first --wait-port 18515 --timeout 180 \
      --host "$BIN perf --server --perftest -B $HOST_SIW -p 18515" \
      --guest "$t -d siw0 -R -F -s 65536 -n 200 $HOST_SIW"
  done
  # Our client of perftest's rdma_cm servers (Send over iWARP would need perftest's credit
  # scheme on the client side, which ours does not keep).
  for t in write read; do
    run_case "ib_${t}_bw-R-guest-server" check_perftest_client --guest-first --wait-port 18515 --timeout 180 \
      --guest "ib_${t}_bw -d siw0 -R -F -s 65536 -n 200" \
      --host "$BIN perf --perftest -R --test $t -p 18515 -s 65536 -n 200 $GUEST_SIW"
  done
}

start_vm() {  # BUILD-DIR
  "$INTEROP" --stop >/dev/null 2>&1
  say "booting the VM (BUILD=$1)"
  "$INTEROP" --start --build "$1" ${MTU:+--mtu "$MTU"} >/dev/null || { say "VM boot failed"; return 1; }
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
  [ -n "$a" ] && [ "$a" = "$b" ] || { echo "our capture has $a messages, the bridge's $b"; return 1; }
  grep -qE "^  tx_units +$((3 * COUNT))\$" "$1" || { echo "QP tx_units is not $((3 * COUNT))"; return 1; }
  grep -qE "^  rx_units +$((4 * COUNT))\$" "$1" || { echo "QP rx_units is not $((4 * COUNT))"; return 1; }
}
trap '"$INTEROP" --stop >/dev/null 2>&1' EXIT

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
  [ "$PERFTEST" = 1 ] && perftest_cases
else
  record "boot (default siw)" 0 "the VM did not boot"
fi

# siw built with SIW_MPA_CRC=1: CRC required.
if [ "$CRC" = 1 ]; then
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
