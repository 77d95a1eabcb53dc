#!/usr/bin/env bash
# interop-nfsd.sh - `softrdma nfsd` (our NFSv3 server, RPC-over-RDMA and TCP) mounted by the
# Linux kernel's NFS client in the interop VM: over siw (proto=rdma) and over TCP.
#
# The host side (namespace rdmavm, 10.77.1.1) runs `softrdma nfsd --export DIR` (no rpcbind
# there: it answers portmap itself). The VM (../shared/interop-vm, id 1) mounts
#   mount -t nfs -o vers=3,proto=P,port=20049|2049,mountproto=tcp,nolock 10.77.1.1:DIR /mnt/s
# and for each protocol runs, checked by the guest (and the files checked on the host):
#   P-mount           the mount appears in /proc/mounts
#   P-write-<size>    dd of a random file of <size> octets, sync, drop caches, read back:
#                     the md5 matches the source's, and the host's copy in DIR
#   P-tree            mkdir -p and 200 files; ls -lR lists all 200
#   P-namespace       mv, ln, ln -s, chmod, truncate: stat/readlink/cat in the guest agree,
#                     and so does the host's view of DIR
#   P-rm-r            rm -r of the tree: gone for the guest and in DIR
#   P-df              df shows the export's filesystem
#   P-under-attack    a 4 MiB write and read-back (md5 in the guest and on the host) while
#                     scripts/nfsd-attacks.py runs one round of every attack class from the
#                     host side (non-reading clients, unfinished records, floods of
#                     connections, half-open and idle ones, unanswered Read chunks, MNT
#                     floods, pipelined READDIRPLUS, garbage)
#   P-remount         umount, restart softrdma nfsd, mount again: every file, same md5
#   P-dd-64MiB        throughput: the guest's dd of 64 MiB to and from the mount (MB/s)
# With --kernel, a second VM (id 2, 10.77.1.3) runs the kernel's nfsd (as tests/nfs-rdma.sh
# sets it up) and the same dd runs against it from VM 1: kernel-P-dd-64MiB, for comparison.
# Every case's capture decodes with `softrdma decode --strict`, whole and cut at 128 octets a
# frame as `tcpdump -s 128` takes it (with editcap).
#
# With --rxe the same runs over RoCE: `softrdma nfsd --transport roce` on 10.77.0.1, the
# guest mounting 10.77.0.1 over rxe0 (the kernel's xprtrdma connects with rdma_cm over the IB
# CM on QP1), cases named rxe-P-...; the kernel's nfsd of --kernel is then reached at 10.77.0.3.
#
# Usage: scripts/interop-nfsd.sh [--sizes "0 1 4095 4096 4097 1048576 67108864"]
#                                [--protos "rdma tcp"] [--loss PCT] [--kernel] [--rxe]
#                                [--no-build] [--out DIR]
# --loss PCT drops PCT % of the packets both ways for the whole run (netem on the guest's
# eth1, an nft rule on the host side), as interop-rxe.sh does.
# Needs root and /dev/net/tun. Prints PASS/FAIL per case and a summary; exit 0 only if all pass.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VMDIR=$ROOT/../shared/interop-vm
STATE=${INTEROP_VM_STATE:-/var/tmp/interop-vm}
NS=${NETNS:-rdmavm}
SIZES="0 1 4095 4096 4097 1048576 67108864"
PROTOS="rdma tcp"
LOSS=0
KERNEL=0
RXE=0
BUILD=1
OUT=$ROOT/target/interop-nfsd
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) SIZES=$2; shift ;;
    --protos) PROTOS=$2; shift ;;
    --loss) LOSS=$2; shift ;;
    --kernel) KERNEL=1 ;;
    --rxe) RXE=1 ;;
    --no-build) BUILD=0 ;;
    --out) OUT=$2; shift ;;
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
rm -rf "$EXPORT" && mkdir -p "$EXPORT" && chmod 1777 "$EXPORT"
: > "$OUT/nfsd.log"
. "$VMDIR/vmctl.sh"
say() { echo "[interop-nfsd $(date +%T)] $*" >&2; }
. "$ROOT/scripts/interop-lib.sh"
# case NAME GUEST_CMD TIMEOUT CHECK: runs GUEST_CMD in the VM under a capture; CHECK (a shell
# function given the guest's output file) decides.
run_case() {
  local name=$1 cmd=$2 timeout=$3 check=$4 ok=1 why=""
  cap_start "$OUT/$name.pcap"
  if ! vm_exec "$V" "$cmd" "$timeout" >"$OUT/$name.log" 2>&1; then
    ok=0 why="guest command failed: $(tail -1 "$OUT/$name.log")"
  elif ! why=$($check "$OUT/$name.log"); then
    ok=0
  fi
  cap_stop
  decode_check "$name" || { [ $ok = 1 ] && { ok=0; why="decode --strict failed (see $OUT/$name.decode)"; }; }
  record "$name" $ok "$why"
}

NFSD="" STARTS=0
nfsd_start() {
  STARTS=$((STARTS + 1))
  # shellcheck disable=SC2086
  ip netns exec "$NS" "$BIN" nfsd --export "$EXPORT" $NFSD_FLAGS >>"$OUT/nfsd.log" 2>&1 &
  NFSD=$!
  local i=0
  while [ $i -lt 100 ] && [ "$(grep -c exporting "$OUT/nfsd.log" 2>/dev/null)" -lt "$STARTS" ]; do sleep 0.1; i=$((i + 1)); done
  kill -0 "$NFSD" 2>/dev/null
}
nfsd_stop() { [ -n "$NFSD" ] && { kill "$NFSD" 2>/dev/null; wait "$NFSD" 2>/dev/null; }; NFSD=""; }

# siw's network (eth1, 10.77.1.0/24), or rxe's with --rxe (eth0, 10.77.0.0/24).
if [ $RXE = 1 ]; then
  GUEST=10.77.0.2 HOST_IP=10.77.0.1 KERNEL_IP=10.77.0.3 NETDEV=eth0
  NFSD_FLAGS="--transport roce --bind $HOST_IP"
else
  GUEST=10.77.1.2 HOST_IP=10.77.1.1 KERNEL_IP=10.77.1.3 NETDEV=eth1
  NFSD_FLAGS=""
fi
loss_on() { net_loss_on "$V" "$NETDEV" "$GUEST" "$LOSS"; }
loss_off() { net_loss_off "$V" "$NETDEV"; }

V=$STATE/runs/nfsd-interop-$(date +%Y%m%d-%H%M%S)
V2=""
cleanup() { cap_stop; loss_off; nfsd_stop; vm_quit "$V" 2>/dev/null; [ -n "$V2" ] && vm_quit "$V2" 2>/dev/null; }
trap cleanup EXIT
"$VMDIR/build-image.sh" >"$OUT/build.log" 2>&1 || { say "VM image build failed"; exit 1; }
say "booting the VM"
vm_boot "$V" --id 1 --smp 2 --mem 1024 --timeout 3600 >/dev/null 2>>"$OUT/build.log" || { say "boot failed"; exit 1; }
vm_exec "$V" "modprobe rpcrdma 2>/dev/null; mkdir -p /mnt/s /tmp/w; mount -t tmpfs -o size=300m tmpfs /tmp/w" 60 >/dev/null 2>&1
nfsd_start || { cat "$OUT/nfsd.log"; say "softrdma nfsd did not start"; exit 1; }
[ "$LOSS" != 0 ] && { loss_on || exit 1; }
TAG=""
[ $RXE = 1 ] && TAG="rxe-"
[ "$LOSS" != 0 ] && TAG="${TAG}loss$LOSS-"

# dd_case NAME PROTO: 64 MiB written (with fsync) to /mnt/s and read back after dropping the
# cache; the guest's clock in centiseconds around each dd (busybox dd prints no rate).
check_dd() {
  local w r
  w=$(awk '$1 == "write" {print $2}' "$1"); r=$(awk '$1 == "read" {print $2}' "$1")
  [ -n "$w" ] && [ -n "$r" ] || { echo "dd: $(tail -1 "$1")"; return 1; }
}
dd_case() {
  local UP="cut -d' ' -f1 /proc/uptime | tr -d ."
  run_case "$1" "a=\$($UP) && dd if=/dev/zero of=/mnt/s/dd-$2 bs=1M count=64 conv=fsync 2>/dev/null && b=\$($UP) && echo 3 > /proc/sys/vm/drop_caches && c=\$($UP) && dd if=/mnt/s/dd-$2 of=/dev/null bs=1M 2>/dev/null && d=\$($UP) && echo write \$((b - a)) && echo read \$((d - c)) && rm /mnt/s/dd-$2" 900 check_dd
  mbs() { awk -v k="$1" '$1 == k && $2 > 0 {printf "%.1f MB/s", 6710.8864 / $2}' "$OUT/$2.log"; }
  NOTES+=("$1: the guest's dd of 64 MiB: write $(mbs write "$1"), read $(mbs read "$1")")
}

expect_lines() {  # FILE WANT: the guest's output, less blank lines, is WANT
  local got
  got=$(grep -v '^$' "$1" | tr '\n' ' ' | sed 's/ $//')
  [ "$got" = "$2" ] || { echo "guest said '$got', expected '$2'"; return 1; }
}

for proto in $PROTOS; do
  P=$TAG$proto
  port=20049; [ "$proto" = tcp ] && port=2049
  MOUNT="mount -t nfs -o vers=3,proto=$proto,port=$port,mountproto=tcp,nolock $HOST_IP:$EXPORT /mnt/s"
  check_mount() { grep -q " /mnt/s nfs " "$1" || { echo "not in /proc/mounts"; return 1; }; }
  run_case "$P-mount" "$MOUNT && grep ' /mnt/s ' /proc/mounts" 120 check_mount
  grep -q " /mnt/s nfs " "$OUT/$P-mount.log" || { say "$P: not mounted, skipping its cases"; continue; }
  declare -A SUM=()
  for size in $SIZES; do
    f=f-$proto-$size
    check_write() {
      local src dst host
      src=$(awk 'NR==1 {print $1}' "$1"); dst=$(awk 'NR==2 {print $1}' "$1")
      host=$(md5sum < "$EXPORT/$CUR" | awk '{print $1}')
      [ -n "$src" ] && [ "$src" = "$dst" ] || { echo "read back $dst, wrote $src"; return 1; }
      [ "$host" = "$src" ] || { echo "the host's copy has md5 $host, not $src"; return 1; }
    }
    CUR=$f
    run_case "$P-write-$size" "head -c $size /dev/urandom > /tmp/w/src && dd if=/tmp/w/src of=/mnt/s/$f bs=1M 2>/dev/null && sync && echo 3 > /proc/sys/vm/drop_caches && md5sum < /tmp/w/src && md5sum < /mnt/s/$f" 600 check_write
    SUM[$f]=$(awk 'NR==1 {print $1}' "$OUT/$P-write-$size.log")
  done
  check_write_gone() {
    local src dst
    src=$(awk 'NR==1 {print $1}' "$1"); dst=$(awk 'NR==2 {print $1}' "$1")
    [ -n "$src" ] && [ "$src" = "$dst" ] || { echo "read back $dst, wrote $src"; return 1; }
  }
  check_tree() { expect_lines "$1" "200" && [ "$(ls "$EXPORT/tree-$proto/a/b/c" | wc -l)" = 200 ] || { echo "the host does not see 200 files"; return 1; }; }
  run_case "$P-tree" "mkdir -p /mnt/s/tree-$proto/a/b/c && for i in \$(seq 1 200); do echo \$i > /mnt/s/tree-$proto/a/b/c/f\$i; done && ls -lR /mnt/s/tree-$proto | grep -c '^-'" 600 check_tree
  T=/mnt/s/tree-$proto
  check_ns() {
    expect_lines "$1" "2 600 moved 1 3 12" || return 1
    local h=$EXPORT/tree-$proto
    [ "$(stat -c '%h %a' "$h/moved")" = "2 600" ] || { echo "host: moved is $(stat -c '%h %a' "$h/moved")"; return 1; }
    [ "$(readlink "$h/soft")" = moved ] || { echo "host: soft -> $(readlink "$h/soft")"; return 1; }
    [ "$(stat -c %s "$h/a/b/c/f2")" = 3 ] || { echo "host: f2 has $(stat -c %s "$h/a/b/c/f2") octets"; return 1; }
    [ ! -e "$h/a/b/c/f1" ] || { echo "host: f1 still there"; return 1; }
  }
  run_case "$P-namespace" "mv $T/a/b/c/f1 $T/moved && ln $T/moved $T/hard && ln -s moved $T/soft && chmod 600 $T/moved && truncate -s 3 $T/a/b/c/f12 && truncate -s 3 $T/a/b/c/f2 && stat -c '%h %a' $T/moved && readlink $T/soft && cat $T/soft && stat -c %s $T/a/b/c/f2 && head -c 2 $T/a/b/c/f12" 120 check_ns
  check_rm() { expect_lines "$1" "gone" && [ ! -e "$EXPORT/tree-$proto" ] || { echo "the host still has the tree"; return 1; }; }
  run_case "$P-rm-r" "rm -r $T && ! test -e $T && echo gone" 300 check_rm
  check_df() { awk 'END { exit !($2 > 0) }' "$1" || { echo "df: $(tail -1 "$1")"; return 1; }; }
  run_case "$P-df" "df -P -k /mnt/s | tail -1" 60 check_df
  # What the attacker looks up: a 1 MiB file and a directory of 3,000 entries.
  head -c $((1 << 20)) /dev/urandom > "$EXPORT/big"
  mkdir -p "$EXPORT/bigdir" && (cd "$EXPORT/bigdir" && seq -f e%g 1 3000 | xargs touch)
  H timeout 300 python3 "$ROOT/scripts/nfsd-attacks.py" --target "$HOST_IP" --export "$EXPORT" --once >"$OUT/$P-under-attack.attacks" 2>&1 &
  ATT=$!
  CUR=attack-$proto
  run_case "$P-under-attack" "head -c 4194304 /dev/urandom > /tmp/w/src && dd if=/tmp/w/src of=/mnt/s/$CUR bs=1M 2>/dev/null && sync && echo 3 > /proc/sys/vm/drop_caches && md5sum < /tmp/w/src && md5sum < /mnt/s/$CUR && rm /mnt/s/$CUR" 600 check_write_gone
  wait "$ATT"
  kill -0 "$NFSD" 2>/dev/null || record "$P-under-attack-server-up" 0 "softrdma nfsd exited"
  NOTES+=("$P-under-attack: $(grep -c 'rounds done, 0 refused' "$OUT/$P-under-attack.attacks") of 9 attack classes ran whole")
  rm -rf "$EXPORT/big" "$EXPORT/bigdir"
  # Unmounted, the server restarted: the files and their handles are still good.
  vm_exec "$V" "umount /mnt/s" 60 >/dev/null 2>&1
  nfsd_stop; nfsd_start || say "softrdma nfsd did not restart"
  want=""
  sums="true"
  for size in $SIZES; do
    want="$want ${SUM[f-$proto-$size]}"
    sums="$sums && md5sum < /mnt/s/f-$proto-$size"
  done
  want=${want# }
  check_remount() { expect_lines "$1" "$want"; }
  run_case "$P-remount" "$MOUNT && { $sums; } | awk '{print \$1}'" 300 check_remount
  dd_case "$P-dd-64MiB" "$proto"
  vm_exec "$V" "rm -f /mnt/s/f-$proto-*; umount /mnt/s" 120 >/dev/null 2>&1
done

# The kernel's own nfsd on the same setup: VM 2 serves, VM 1 mounts it and runs the same dd.
if [ $KERNEL = 1 ]; then
  V2=$STATE/runs/nfsd-interop-kernel-$(date +%Y%m%d-%H%M%S)
  say "booting VM 2 (the kernel's nfsd)"
  if vm_boot "$V2" --id 2 --smp 2 --mem 1024 --timeout 3600 >/dev/null 2>>"$OUT/build.log" &&
     vm_exec "$V2" 'set -e
modprobe nfsd; modprobe rpcrdma
mount -t nfsd nfsd /proc/fs/nfsd
mkdir -p /export /run/rpcbind /var/lib/nfs/v4recovery
mount -t tmpfs -o size=400m tmpfs /export; chmod 1777 /export
echo "/export *(rw,no_root_squash,insecure,no_subtree_check,fsid=1)" > /etc/exports
rpcbind; exportfs -ra; rpc.mountd; rpc.nfsd 4
echo "rdma 20049" > /proc/fs/nfsd/portlist' 120 >"$OUT/kernel-setup.log" 2>&1; then
    for proto in $PROTOS; do
      port=20049; [ "$proto" = tcp ] && port=2049
      if vm_exec "$V" "mount -t nfs -o vers=3,proto=$proto,port=$port,mountproto=tcp,nolock $KERNEL_IP:/export /mnt/s" 120 >"$OUT/kernel-$proto-mount.log" 2>&1; then
        dd_case "kernel-$TAG$proto-dd-64MiB" "$proto"
        vm_exec "$V" "umount /mnt/s" 60 >/dev/null 2>&1
      else
        record "kernel-$TAG$proto-mount" 0 "could not mount the kernel's nfsd: $(tail -1 "$OUT/kernel-$proto-mount.log")"
      fi
    done
  else
    record "kernel-nfsd" 0 "VM 2 with the kernel's nfsd did not come up (see $OUT/kernel-setup.log)"
  fi
fi

summary interop-nfsd
