#!/usr/bin/env bash
# soak-nfsd.sh - `softrdma nfsd` under attack beside legitimate kernel clients (issue 41,
# Done-when 2). A benchmark, not a test.
#
#   scripts/soak-nfsd.sh [--minutes M] [--warmup S] [--out DIR] [--no-build] [--rxe]
#                        [--mimalloc]
#
# The host side (namespace rdmavm, as interop-nfsd.sh) runs `softrdma nfsd --export DIR`
# with its default limits. The interop VM (../shared/interop-vm) mounts it twice, over
# RDMA (siw; rxe with --rxe) and over TCP, and loops for M minutes (default 30): write a
# file of 1 MiB (random) and one of 4 MiB to each mount, drop the caches, read both back
# and compare md5s, list the directory, remove them. Every failed step is counted. Beside
# it, inside the namespace, scripts/nfsd-attacks.py runs every attack class of the review
# against the server over loopback (non-reading clients, unfinished records, connection
# churn, idle and half-open connections, unanswered Read chunks, MNT floods, pipelined
# READDIRPLUS, garbage), all at once, round after round. After each round (its connections
# closed by the attacker or ended by the server's limits) the server's RSS, open descriptors
# and threads are sampled into DIR/samples.csv, so that every sample is taken at the same
# point of the cycle; the summary gives their spread after the warm-up (S seconds, default
# 300; flat: every sample of RSS, fds and threads within 5 % of that figure's median; RSS's
# peak per 5 minutes is shown beside) and the legitimate operations done and failed.
#
# The server runs on glibc's malloc, as `softrdma nfsd` does by default (crates/cli/src/
# alloc.rs); --mimalloc runs it on mimalloc (SOFTRDMA_MALLOC=mimalloc), whose RSS moves by
# tens of megabytes with what it keeps of freed memory (docs/performance.md).
#
# Needs root and /dev/net/tun; exits 0 if no legitimate operation failed, the server stayed
# up, and the samples after warm-up stayed within 5 %.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VMDIR=$ROOT/../shared/interop-vm
STATE=${INTEROP_VM_STATE:-/var/tmp/interop-vm}
NS=${NETNS:-rdmavm}
MINUTES=30
WARMUP=300
BUILD=1
RXE=0
MALLOC=""
OUT=$ROOT/target/soak-nfsd
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-build) BUILD=0 ;;
    --rxe) RXE=1 ;;
    --mimalloc) MALLOC=mimalloc ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
BIN=${SOFTRDMA_BIN:-$ROOT/target/release/softrdma}
[ -n "${SOFTRDMA_BIN:-}" ] && BUILD=0
if [ $BUILD = 1 ]; then
  (cd "$ROOT" && cargo build --release -p softrdma-cli) || exit 1
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
EXPORT=$OUT/export
rm -rf "$EXPORT" && mkdir -p "$EXPORT/bigdir" && chmod 1777 "$EXPORT"
head -c $((1 << 20)) /dev/urandom > "$EXPORT/big"
for i in $(seq 1 3000); do : > "$EXPORT/bigdir/entry-$i"; done
. "$VMDIR/vmctl.sh"
say() { echo "[soak-nfsd $(date +%T)] $*" >&2; }

if [ $RXE = 1 ]; then
  HOST_IP=10.77.0.1 FLAGS="--transport roce --bind 10.77.0.1"
else
  HOST_IP=10.77.1.1 FLAGS=""
fi
V=$STATE/runs/soak-nfsd-$(date +%Y%m%d-%H%M%S)
NFSD=""
cleanup() {
  [ -n "$NFSD" ] && { kill "$NFSD" 2>/dev/null; wait "$NFSD" 2>/dev/null; }
  vm_quit "$V" 2>/dev/null
}
trap cleanup EXIT
"$VMDIR/build-image.sh" >"$OUT/build.log" 2>&1 || { say "VM image build failed"; exit 1; }
say "booting the VM"
vm_boot "$V" --id 1 --smp 2 --mem 1024 --timeout $((MINUTES * 60 + 1800)) >/dev/null 2>>"$OUT/build.log" || { say "boot failed"; exit 1; }
vm_exec "$V" "modprobe rpcrdma 2>/dev/null; mkdir -p /mnt/r /mnt/t /tmp/w; mount -t tmpfs -o size=64m tmpfs /tmp/w" 60 >/dev/null 2>&1
# shellcheck disable=SC2086
ip netns exec "$NS" env SOFTRDMA_MALLOC=$MALLOC "$BIN" nfsd --export "$EXPORT" --stats 60 $FLAGS >"$OUT/nfsd.log" 2>&1 &
NFSD=$!
i=0; while [ $i -lt 100 ] && ! grep -q exporting "$OUT/nfsd.log"; do sleep 0.1; i=$((i + 1)); done
kill -0 "$NFSD" 2>/dev/null || { cat "$OUT/nfsd.log"; say "softrdma nfsd did not start"; exit 1; }
NFSD_PID=$(pgrep -f "softrdma nfsd --export $EXPORT" | head -1)

OPTS="vers=3,mountproto=tcp,nolock,soft,timeo=100,retrans=3"
vm_exec "$V" "mount -t nfs -o $OPTS,proto=rdma,port=20049 $HOST_IP:$EXPORT /mnt/r && mount -t nfs -o $OPTS,proto=tcp,port=2049 $HOST_IP:$EXPORT /mnt/t && grep -c ' nfs ' /proc/mounts" 120 >"$OUT/mount.log" 2>&1 || { cat "$OUT/mount.log"; say "mount failed"; exit 1; }

# The guest's loop: OK/FAIL lines per step, until the deadline.
END=$(( $(date +%s) + MINUTES * 60 ))
GUEST_LOOP='n=0; end=$(( $(date +%s) + '$((MINUTES * 60))' ))
step() { if eval "$2" >/dev/null 2>&1; then echo "OK $1"; else echo "FAIL $1 $(date +%T)"; fi; }
while [ $(date +%s) -lt $end ]; do
  n=$((n + 1))
  head -c 1048576 /dev/urandom > /tmp/w/a; head -c 4194304 /dev/urandom > /tmp/w/b
  for m in r t; do
    d=/mnt/$m/soak-$m
    step "$m-mkdir" "mkdir -p $d"
    step "$m-write" "cp /tmp/w/a $d/a.$n && cp /tmp/w/b $d/b.$n && sync"
    echo 3 > /proc/sys/vm/drop_caches
    step "$m-read" "cmp /tmp/w/a $d/a.$n && cmp /tmp/w/b $d/b.$n"
    step "$m-ls" "ls -l $d | grep -q b.$n"
    step "$m-rm" "rm $d/a.$n $d/b.$n"
  done
done; echo DONE'
JOB=$(vm_spawn "$V" "$GUEST_LOOP" soak)

# The attacker, inside the namespace, over loopback: one round of every attack at a time.
echo "seconds,rss_kib,fds,threads" > "$OUT/samples.csv"
START=$(date +%s) ROUNDS=0
: > "$OUT/attacks.log"
while [ "$(date +%s)" -lt "$END" ] && kill -0 "$NFSD" 2>/dev/null; do
  ip netns exec "$NS" timeout 300 python3 "$ROOT/scripts/nfsd-attacks.py" --target 127.0.0.1 --export "$EXPORT" --once >>"$OUT/attacks.log" 2>>"$OUT/attacks.err"
  ROUNDS=$((ROUNDS + 1))
  sleep 3
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$NFSD_PID/status" 2>/dev/null)
  fds=$(ls "/proc/$NFSD_PID/fd" 2>/dev/null | wc -l)
  thr=$(awk '/^Threads:/ {print $2}' "/proc/$NFSD_PID/status" 2>/dev/null)
  echo "$(( $(date +%s) - START )),$rss,$fds,$thr" >> "$OUT/samples.csv"
done
UP=0; kill -0 "$NFSD" 2>/dev/null && UP=1
vm_wait "$V" "$JOB" 900 >"$OUT/guest.log" 2>&1

OKS=$(grep -c '^OK ' "$OUT/guest.log")
FAILS=$(grep -c '^FAIL ' "$OUT/guest.log")
say "legitimate operations: $OKS done, $FAILS failed; server up: $UP"
grep '^FAIL ' "$OUT/guest.log" | head -20 >&2
say "attack rounds: $ROUNDS"
awk '/^attack/ {split($0, w, " "); ok[w[2]] += w[3]; bad[w[2]] += w[6]} END {for (k in ok) printf "  %-10s %d rounds done, %d refused or cut short\n", k, ok[k], bad[k]}' "$OUT/attacks.log" >&2
# After the warm-up: each figure's range over the samples and its farthest sample from the
# median (flat: within 5 %), and RSS's peak in each 5-minute window.
FLAT=$(python3 - "$OUT/samples.csv" "$WARMUP" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["rss_kib"] and int(r["seconds"]) >= int(sys.argv[2])]
if not rows:
    print("no samples"); sys.exit(1)
bad, out = False, []
for key, name in (("rss_kib", "rss"), ("fds", "fds"), ("threads", "threads")):
    v = [int(r[key]) for r in rows]
    med = statistics.median(v)
    far = max(abs(x - med) for x in v) / med * 100 if med else 0.0
    bad |= far > 5
    out.append(f"{name} {min(v)}..{max(v)} (median {med:g}, farthest {far:.1f} %)")
peaks = {}
for r in rows:
    k = (int(r["seconds"]) - int(sys.argv[2])) // 300
    peaks[k] = max(peaks.get(k, 0), int(r["rss_kib"]))
print(" ".join(out), f"over {len(rows)} samples; rss peak per 5 min:", " ".join(str(peaks[k]) for k in sorted(peaks)))
sys.exit(1 if bad else 0)
PY
)
FLAT_OK=$?
say "after warm-up: $FLAT"
[ "$FAILS" = 0 ] && [ "$OKS" -gt 0 ] && [ $UP = 1 ] && [ $FLAT_OK = 0 ]
