# interop-lib.sh - what the interop scripts share: PASS/FAIL bookkeeping, captures of the
# VM bridge and their `softrdma decode --strict` check. Sourced; expects NS (the host-side
# network namespace), OUT (logs and pcaps) and BIN (the softrdma binary).
PASSED=0 FAILED=0
RESULTS=() NOTES=()
record() {  # NAME OK REASON
  if [ "$2" = 1 ]; then RESULTS+=("PASS  $1"); PASSED=$((PASSED + 1)); echo "PASS  $1"
  else RESULTS+=("FAIL  $1: $3"); FAILED=$((FAILED + 1)); echo "FAIL  $1: $3"; fi
}
H() { ip netns exec "$NS" "$@"; }
CAP=""
cap_start() {  # PCAP: tcpdump on the bridge until cap_stop
  rm -f "$1"
  # Not through H: $! must be tcpdump itself (ip netns exec execs it), not a subshell.
  ip netns exec "$NS" tcpdump -i rdmabr0 -s 0 -U --immediate-mode -Z root -w "$1" ip >"$OUT/tcpdump.log" 2>&1 &
  CAP=$!
  local i=0
  while [ $i -lt 50 ] && ! grep -q listening "$OUT/tcpdump.log" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
}
cap_stop() { [ -n "$CAP" ] && { sleep 0.3; kill -INT "$CAP" 2>/dev/null; wait "$CAP" 2>/dev/null; }; CAP=""; }
# decode_check NAME: `softrdma decode --strict` of OUT/NAME.pcap, and of the same capture cut
# at 128 octets a frame as `tcpdump -s 128` takes it (headers only; with editcap). Under TCG
# tcpdump on the bridge drops packets of bulk transfers; a capture whose only errors are the
# TCP gaps those drops leave is a note, not a failure.
decode_check() {
  local log=$OUT/$1.decode dropped bad gaps
  "$BIN" decode --strict "$OUT/$1.pcap" >"$log" 2>&1 && { snaplen_check "$OUT/$1.pcap" "$OUT/$1"; return; }
  dropped=$(tcpdump_drops "$OUT/tcpdump.log")
  if only_capture_gaps "$log" "$dropped"; then
    NOTES+=("$1: capture incomplete (tcpdump dropped $dropped packets), decode saw only TCP gaps")
    return 0
  fi
  return 1
}
# snaplen_check PCAP BASE: PCAP cut at 128 octets a frame (BASE.s128.pcap) decodes with
# --strict too, into BASE.s128.decode (what was not kept is a note); skipped without editcap.
snaplen_check() {
  command -v editcap >/dev/null || return 0
  editcap -F pcap -s 128 "$1" "$2.s128.pcap" 2>/dev/null || return 1
  "$BIN" decode --strict "$2.s128.pcap" >"$2.s128.decode" 2>&1 || return 1
  rm -f "$2.s128.pcap"
}
# tcpdump_drops TCPDUMP-LOG: the packets tcpdump says the kernel dropped (0: none, or no log).
tcpdump_drops() {
  local n
  n=$(sed -n 's/^\([0-9]*\) packets\? dropped by kernel/\1/p' "$1" 2>/dev/null | tail -1)
  echo "${n:-0}"
}
# case_drops CASE-LOG: tcpdump_drops of the interop.sh run whose logs the case's log names.
case_drops() {
  tcpdump_drops "$(sed -n 's/.*logs in \(.*\)$/\1/p' "$1" | tail -1)/tcpdump.log"
}
# fewer_by_drops NAME OURS BRIDGE DROPPED PER: our own capture holds OURS messages, the bridge's
# BRIDGE; they may differ only when tcpdump dropped packets, by at most PER messages per dropped
# packet (0: any number, a TCP stream's segments hold several), and that is a note.
fewer_by_drops() {
  [ "$2" -gt 0 ] && [ "$4" -gt 0 ] && [ "$3" -lt "$2" ] || return 1
  [ "$5" = 0 ] || [ $(($2 - $3)) -le $(($4 * $5)) ] || return 1
  NOTES+=("$1: the bridge's capture holds $3 of our $2 messages (tcpdump dropped $4 packets)")
}
# only_capture_gaps DECODE-LOG DROPPED: tcpdump dropped packets and every message the decoder
# counted as an error is one of the TCP gaps it reported (one line per gap; decoding resumes
# after each, so no message failed a check).
only_capture_gaps() {
  local bad gaps
  [ -n "$2" ] && [ "$2" != 0 ] || return 1
  bad=$(tail -1 "$1" | sed -n 's/.* \([0-9]*\) with errors$/\1/p')
  gaps=$(grep -cE ": TCP gap: [0-9]+ octets not captured" "$1")
  # Past the first few, the decoder sums them up per stream: "N more TCP gaps".
  gaps=$((gaps + $(sed -n 's/.*: \([0-9]*\) more TCP gaps$/\1/p' "$1" | awk '{ s += $1 } END { print s + 0 }')))
  [ -n "$bad" ] && [ "$bad" -le "$gaps" ]
}
# ---- loss both ways on one of the VM's links ---------------------------------------------
# The host kernel lacks sch_netem, so netem goes on the guest's netdev (guest -> host); host ->
# guest is an nft rule in NS's output hook (what softrdma sends leaves through it), counting
# what it drops. Without nft here the loss is one way only, and NOTES says so.
LOSS_TABLE=softrdma_loss
# net_loss_on VM NETDEV DEST PCT [MATCH]: PCT % of the packets dropped both ways, host -> guest
# those to DEST that also match the nft expression MATCH; 1 (and nothing left on) on failure.
net_loss_on() {
  local vm=$1 dev=$2 dest=$3 pct=$4 match=${5:-}
  vm_exec "$vm" "tc qdisc replace dev $dev root netem loss ${pct}%" 20 >/dev/null 2>&1 ||
    { say "netem on the guest's $dev failed"; return 1; }
  if ! command -v nft >/dev/null 2>&1; then
    NOTES+=("loss on guest -> host only (no nft on this host for host -> guest)")
    return 0
  fi
  H nft -f - <<EOF && return 0
table inet $LOSS_TABLE {
  chain out {
    type filter hook output priority 0;
    ip daddr $dest $match numgen random mod 100 < $pct counter drop
  }
}
EOF
  say "nft loss rule failed"
  net_loss_off "$vm" "$dev"
  return 1
}
# net_loss_off VM NETDEV: the loss of net_loss_on gone (VM empty: the host's rule only).
net_loss_off() {
  [ -n "$1" ] && [ -n "$2" ] && vm_exec "$1" "tc qdisc del dev $2 root" 20 >/dev/null 2>&1
  command -v nft >/dev/null 2>&1 && H nft delete table inet $LOSS_TABLE 2>/dev/null
  return 0
}
# net_loss_counts VM NETDEV: "GUEST->HOST HOST->GUEST" packets dropped so far (netem's and the
# rule's counters).
net_loss_counts() {
  local g h
  g=$(vm_exec "$1" "tc -s qdisc show dev $2" 20 2>/dev/null | sed -n 's/.*(dropped \([0-9]*\),.*/\1/p' | head -1)
  h=$(H nft list table inet $LOSS_TABLE 2>/dev/null | sed -n 's/.*counter packets \([0-9]*\) .*/\1/p' | head -1)
  echo "${g:-0} ${h:-0}"
}
# summary NAME: every result, the notes, the totals; the exit status.
summary() {
  echo
  for r in "${RESULTS[@]}"; do echo "$r"; done
  for n in "${NOTES[@]}"; do echo "note: $n"; done
  echo "$1: $PASSED passed, $FAILED failed (logs and pcaps in $OUT)"
  [ "$FAILED" = 0 ]
}

# The C ABI's rping cases (issue 43), shared by interop-siw.sh and interop-rxe.sh: Debian's
# rping on softrdma against the guest's. Each script defines `section LOG SIDE` and
# `capi_pings` (the pings each side must print now). Debian's rping writes its pings to standard
# output (a file here: block-buffered) and its events to standard error, so a line of either
# may land inside one of the other: count occurrences, not lines.
count_o() { section "$1" "$2" | grep -aoE "$3" | grep -c . || true; }
check_capi_rping_c() {  # our client (-V: it compares every pong) did its pings; the server saw them and our disconnect
  local n s CAPI_PINGS
  CAPI_PINGS=$(capi_pings)
  n=$(section "$1" host | grep -aoE '(server )?ping data: rdma-ping-[0-9]+' | grep -vc '^server' || true)
  [ "$n" = "$CAPI_PINGS" ] || { echo "host rping client printed $n of $CAPI_PINGS pings"; return 1; }
  ! section "$1" host | grep -aq 'data mismatch' || { echo "host rping client: data mismatch"; return 1; }
  s=$(count_o "$1" guest 'server ping data: rdma-ping-[0-9]+')
  [ "$s" = "$CAPI_PINGS" ] || { echo "guest rping server printed $s of $CAPI_PINGS pings"; return 1; }
  section "$1" guest | grep -q "server DISCONNECT EVENT" || { echo "the guest server saw no disconnect"; return 1; }
}
check_capi_rping_s() {  # the guest client's -V passed; our server did its pings and saw the disconnect
  local g s CAPI_PINGS
  CAPI_PINGS=$(capi_pings)
  g=$(count_o "$1" guest '^ping data: rdma-ping-[0-9]+')
  s=$(count_o "$1" host 'server ping data: rdma-ping-[0-9]+')
  [ "$g" = "$CAPI_PINGS" ] || { echo "guest rping client printed $g of $CAPI_PINGS pings"; return 1; }
  ! section "$1" guest | grep -q 'data mismatch' || { echo "guest rping client: data mismatch"; return 1; }
  [ "$s" = "$CAPI_PINGS" ] || { echo "host rping server printed $s of $CAPI_PINGS pings"; return 1; }
  section "$1" host | grep -aq "server DISCONNECT EVENT" || { echo "host rping server saw no disconnect"; return 1; }
}
