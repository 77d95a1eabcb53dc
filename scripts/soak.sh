#!/usr/bin/env bash
# soak.sh - a long run of mixed RC traffic over both transports through an impaired link,
# watching two long-lived servers for leaks (issue 14, Done-when 5). A benchmark, not a test.
#
#   scripts/soak.sh [--minutes M] [--loss PCT] [--reorder PCT] [--dup PCT] [--out DIR] [--no-build]
#                   [--malloc-fixed]
#
# This host's kernel has no netem, so the run happens inside the interop VM
# (../shared/interop-vm, whose kernel has it but no veth): over the guest's loopback
# interface with netem on it, which impairs both directions (default 1 % loss, 1 %
# duplication, 5 % reordering behind a 1 ms delay). `softrdma perf --server` for iWARP and
# one for RoCE, and `softrdma perf` clients one after the other: bandwidth (RDMA Write, Read,
# Send), the same both ways at once (-b), latency, and -q sessions of 1, 8 and 32 QPs, each
# with messages of 1, 777, 4096, 65536 and 1 MiB octets, in a fixed cycle of 20 runs per
# transport. perf checks every octet it moved (a wrong octet, a lost message or a failed
# completion fails that client run).
#
# One whole cycle warms up first (every buffer size, thread and allocator arena the workload
# uses is used once), then the cycle repeats for M minutes (default 30) while the servers'
# RSS, open file descriptors and threads are sampled every minute into DIR/samples.csv (each
# sample waits up to 5 s for the last client's connection to close in the server). A leak
# grows over the samples; what an allocator keeps of the warm-up does not. The summary gives
# the client runs passed and failed and, per server, the spread of each figure over the
# samples (flat: within 5 %).
#
# glibc's allocator keeps much of what it freed (per-thread arenas, and a mmap threshold that
# rises to the largest buffer freed, so 1 MiB buffers come from the heap and fragment it): RSS
# kept climbing slowly long after the warm-up (host probe: 15.0 to 21.1 MB over 14 cycles).
# Registered buffers of 128 KiB and more are now anonymous mappings (PageBuf), which the
# threshold never sees: 8.2 to 9.0 MB over 8 cycles under the default allocator.
# --malloc-fixed runs the servers with MALLOC_ARENA_MAX=1 and a fixed MALLOC_MMAP_THRESHOLD_
# of 128 KiB, so that what RSS shows is what the program holds.
#
# Needs root and /dev/net/tun (the VM); exits 0 if no client run failed and both servers
# stayed up.
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VMDIR=${INTEROP_VM_DIR:-$REPO/../shared/interop-vm}
VMDIR=$(cd "$VMDIR" && pwd)
MIN=30 LOSS=1 REORDER=5 DUP=1 BUILD_BIN=1 MALLOC=default
OUT=$REPO/target/soak
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MIN=$2; shift ;;
    --loss) LOSS=$2; shift ;;
    --reorder) REORDER=$2; shift ;;
    --dup) DUP=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-build) BUILD_BIN=0 ;;
    --malloc-fixed) MALLOC=fixed ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "soak.sh: needs root (the VM's network)" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=${SOFTRDMA_BIN:-$REPO/target/release/softrdma}
if [ "$BUILD_BIN" = 1 ] && [ -z "${SOFTRDMA_BIN:-}" ]; then
  (cd "$REPO" && cargo build --release -p softrdma-cli) || exit 1
fi
[ -x "$BIN" ] || { echo "soak.sh: no $BIN" >&2; exit 2; }
export INTEROP_VM_STATE=${INTEROP_VM_STATE:-/var/tmp/interop-vm}
mkdir -p "$INTEROP_VM_STATE/runs"
say() { echo "[soak $(date +%T)] $*" >&2; }

# The guest image (and the host's qemu) on a fresh machine: about 4 minutes.
if [ ! -e "$INTEROP_VM_STATE/build/vmlinuz" ]; then
  say "building the guest image (../shared/interop-vm/build-image.sh)"
  "$VMDIR/build-image.sh" --install-host-deps >"$OUT/build-image.log" 2>&1 ||
    { say "build-image.sh failed: $OUT/build-image.log"; exit 1; }
fi
# shellcheck source=/dev/null
. "$VMDIR/vmctl.sh"
"$VMDIR/interop.sh" --start >"$OUT/boot.log" 2>&1 || { say "the VM did not start: $OUT/boot.log"; exit 1; }
RUN=$("$VMDIR/interop.sh" --status | sed -n 's/^running: //p')
[ -n "$RUN" ] || { say "no running VM"; exit 1; }
stop_vm() { "$VMDIR/interop.sh" --stop >/dev/null 2>&1; }
trap stop_vm EXIT
cp "$BIN" "$RUN/softrdma-soak"

# The guest side (busybox sh): namespaces, netem, servers, the client loop and the sampler.
cat >"$RUN/soak-guest.sh" <<'GUEST'
set -u
MIN=$1 LOSS=$2 REORDER=$3 DUP=$4 MALLOC=$5
. /etc/vm-profile 2>/dev/null
B=/host/softrdma-soak
O=/host/soak
rm -rf $O; mkdir -p $O
modprobe sch_netem 2>/dev/null
# The guest kernel has no veth: server and clients talk over the loopback interface, netem on
# it impairs both directions (servers on 127.0.0.1, the RoCE client on 127.0.0.2; RoCE on
# UDP 14791).
tc qdisc del dev lo root 2>/dev/null
tc qdisc add dev lo root netem delay 1ms loss ${LOSS}% duplicate ${DUP}% reorder ${REORDER}% 50% ||
  { echo "netem on lo failed"; exit 1; }
E=""
[ "$MALLOC" = fixed ] && E="MALLOC_ARENA_MAX=1 MALLOC_MMAP_THRESHOLD_=131072"
env $E $B perf --server -B 127.0.0.1 -p 18515 >$O/server-iwarp.log 2>&1 &
SI=$!
# rxe holds UDP 4791 in the guest.
env $E $B perf --server --transport roce --roce-port 14791 -B 127.0.0.1 -p 18517 >$O/server-roce.log 2>&1 &
SR=$!
echo "servers: iwarp $SI roce $SR (malloc $MALLOC)"
fds() { set -- /proc/$1/fd/*; N=$#; }
thr() { N=$(awk '/^Threads/ {print $2}' /proc/$1/status); }
# settle PID FDS THREADS: the last client's connection may still be closing in the server
# (its socket goes once its QP is flushed): wait up to 5 s for no more than FDS descriptors
# and THREADS threads. A leak does not settle, and is sampled as it is.
settle() {
  local i=0
  while [ $i -lt 25 ] && [ -d /proc/$1 ]; do
    fds $1; f=$N; thr $1
    [ $f -le $2 ] && [ $N -le $3 ] && return 0
    sleep 0.2; i=$((i + 1))
  done
}
sample() {  # ELAPSED: one line per server
  for sp in "iwarp $SI" "roce $SR"; do
    set -- $sp
    if [ -d /proc/$2 ]; then
      settle $2 ${BASE_FDS:-0} ${BASE_THR:-0}
      rss=$(awk '/^VmRSS/ {print $2}' /proc/$2/status)
      thr $2; t=$N; fds $2
      echo "$ELAPSED,$1,$rss,$N,$t" >>$O/samples.csv
    else
      echo "$ELAPSED,$1,gone,gone,gone" >>$O/samples.csv
    fi
  done
}
# The workload: every size with every kind of run, in a fixed cycle, on both transports:
# bandwidth (RDMA Write, Read, Send), the same both ways at once (-b), latency, and -q
# sessions of 1, 8 and 32 QPs.
set --
for S in 1 777 4096 65536 1048576; do
  L=$(( S > 65536 ? 65536 : S )) Q=$(( S > 65536 ? 4096 : S ))
  set -- "$@" "--bw -s $S -D 3" "--bw -b -s $S -D 3" "--lat -s $L -n 300" "-q 1,8,32 -s $Q -D 2"
done
NCFG=$#
ok=0 bad=0 i=0
run() {  # ARGS: one client run per transport
  for t in iwarp roce; do
    case $t in iwarp) P=18515 X="" ;; roce) P=18517 X="-B 127.0.0.2 --roce-port 14791" ;; esac
    if $B perf --transport $t 127.0.0.1 -p $P $X "$@" >$O/client.out 2>&1; then
      ok=$((ok + 1))
    else
      bad=$((bad + 1))
      { echo "=== run $i $t $*"; cat $O/client.out; } >>$O/failures.log
    fi
    echo "$(( $(date +%s) - START )) run $i $t $*: $([ -s $O/client.out ] && tail -1 $O/client.out)" >>$O/runs.log
  done
}
echo "elapsed_s,server,rss_kib,fds,threads" >$O/samples.csv
# Warm-up: one whole cycle, so that every buffer size, thread and allocator arena the
# workload uses has been used once; a leak grows after it, what an allocator keeps does not.
START=$(date +%s)
sleep 2
for A in "$@"; do run $A; i=$((i + 1)); done
echo "warm-up: $i runs per transport in $(( $(date +%s) - START )) s, $ok passed, $bad failed"
# The descriptors and threads of an idle server: the fewest seen over 5 s (the warm-up's
# last connection may still be closing).
BASE_FDS=0 BASE_THR=0
for p in $SI $SR; do
  mf=100000 mt=100000 j=0
  while [ $j -lt 25 ]; do
    fds $p; [ $N -lt $mf ] && mf=$N; thr $p; [ $N -lt $mt ] && mt=$N
    sleep 0.2; j=$((j + 1))
  done
  [ $mf -gt $BASE_FDS ] && BASE_FDS=$mf; [ $mt -gt $BASE_THR ] && BASE_THR=$mt
done
START=$(date +%s)
END=$((START + MIN * 60))
NEXT=$((START + 60))
ELAPSED=0; sample
while [ "$(date +%s)" -lt "$END" ]; do
  k=$((i % NCFG + 1))
  eval "A=\${$k}"
  run $A
  i=$((i + 1))
  now=$(date +%s)
  if [ "$now" -ge "$NEXT" ]; then ELAPSED=$((now - START)); sample; NEXT=$((NEXT + 60)); fi
done
ELAPSED=$(( $(date +%s) - START )); sample
alive=1
for p in $SI $SR; do [ -d /proc/$p ] || alive=0; kill $p 2>/dev/null; done
echo "client runs: $ok passed, $bad failed ($i per transport, $NCFG in the warm-up); servers alive to the end: $alive"
tc qdisc del dev lo root
[ "$bad" = 0 ] && [ "$alive" = 1 ]
GUEST

say "VM $RUN; $MIN minutes, loss $LOSS %, reordering $REORDER %, duplication $DUP %, malloc $MALLOC"
JOB=$(vm_spawn "$RUN" "sh /host/soak-guest.sh $MIN $LOSS $REORDER $DUP $MALLOC" soak)
# The guest's agent stops after 30 minutes without a new job, a running one or not: a no-op
# job every 10 minutes keeps it, and the VM, up (vm_wait would kill the job at its timeout).
END=$(( $(date +%s) + MIN * 60 + 2700 ))  # the warm-up: about 15 minutes under TCG
TICK=$(( $(date +%s) + 600 ))
while [ ! -e "$RUN/q/$JOB.rc" ] && [ "$(date +%s)" -lt "$END" ] && vm_qemu_alive "$RUN"; do
  if [ "$(date +%s)" -ge "$TICK" ]; then
    vm_exec "$RUN" true 60 >/dev/null 2>&1
    TICK=$(( $(date +%s) + 600 ))
  fi
  sleep 5
done
vm_wait "$RUN" "$JOB" 60 >"$OUT/guest.out"
RC=$?
cp -r "$RUN/soak/." "$OUT/" 2>/dev/null
cat "$OUT/guest.out"
# The spread of each figure per server over the samples, the first (at the end of the
# warm-up) included.
[ -e "$OUT/samples.csv" ] || { say "no samples (the guest side failed early)"; exit 1; }
python3 - "$OUT/samples.csv" <<'PY' | tee "$OUT/summary.txt"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for server in ("iwarp", "roce"):
    r = [x for x in rows if x["server"] == server]
    if any(x["rss_kib"] == "gone" for x in r):
        print(f"{server}: the server went away")
        continue
    later = r
    for col in ("rss_kib", "fds", "threads"):
        v = [int(x[col]) for x in later]
        lo, hi = min(v), max(v)
        spread = (hi - lo) / lo * 100 if lo else 0.0
        print(f"{server} {col}: first {r[0][col]}, then {lo}..{hi} over {len(v)} samples "
              f"(spread {spread:.1f} %){'' if spread <= 5 else '  NOT FLAT'}")
PY
exit $RC
