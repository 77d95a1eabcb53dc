#!/usr/bin/env bash
# interop-nfs.sh - `softrdma nfs` (NFSv3 client over RPC-over-RDMA, RFC 8166/8267) against the
# Linux kernel's NFS server (nfsd + svcrdma) in the interop VM, over siw (iWARP) and over TCP.
#
# One VM (../shared/interop-vm, id 1) exports a tmpfs /export as tests/nfs-rdma.sh does
# (rpcbind, rpc.mountd, nfsd with "rdma 20049" in its portlist). From the host side
# (namespace rdmavm, 10.77.1.1) for each protocol (rdma over siw0 10.77.1.2, tcp):
#   put-<size>   softrdma nfs put of a random file of <size> octets, get back, cmp
#   ls           softrdma nfs ls lists every file with its size
#   guest-file   a file the guest wrote is read back; its md5 is the guest's
#   rm           softrdma nfs rm removes them; ls and the guest agree
# Each RDMA case's capture decodes with `softrdma decode --strict` (whole, and cut at 128 octets
# a frame as `tcpdump -s 128` takes it, with editcap), and the run's captures
# must show Read chunks (WRITE), Write chunks (READ) and Reply chunks (READDIRPLUS), and
# replies by Send With Invalidate (RFC 8797 remote invalidation, which we advertise).
#
# With --rxe the RDMA cases run over RoCE: `softrdma nfs --transport roce` from 10.77.0.1 to
# the nfsd at 10.77.0.2 over rxe0 (our connection manager speaks the IB CM on QP1 to the
# kernel's rdma_cm), cases named rxe-rdma-...; TCP cases go to 10.77.0.2 as well.
#
# --loss PCT drops PCT % of the packets both ways for the whole run (netem on the guest's
# netdev, an nft rule on the host side), cases named [rxe-]lossPCT-...
#
# Usage: scripts/interop-nfs.sh [--sizes "0 1 4095 4096 1048577 67108864"] [--protos "rdma tcp"]
#                               [--rxe] [--loss PCT] [--no-build] [--out DIR]
# Needs root and /dev/net/tun. Prints PASS/FAIL per case and a summary; exit 0 only if all pass.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VMDIR=$ROOT/../shared/interop-vm
STATE=${INTEROP_VM_STATE:-/var/tmp/interop-vm}
NS=${NETNS:-rdmavm}
SIZES="0 1 4095 4096 1048577 67108864"
PROTOS="rdma tcp"
BUILD=1
RXE=0
LOSS=0
OUT=$ROOT/target/interop-nfs
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) SIZES=$2; shift ;;
    --protos) PROTOS=$2; shift ;;
    --no-build) BUILD=0 ;;
    --rxe) RXE=1 ;;
    --loss) LOSS=$2; shift ;;
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
. "$VMDIR/vmctl.sh"
say() { echo "[interop-nfs $(date +%T)] $*" >&2; }
. "$ROOT/scripts/interop-lib.sh"

V=$STATE/runs/nfs-interop-$(date +%Y%m%d-%H%M%S)
cleanup() { cap_stop; [ "$LOSS" != 0 ] && net_loss_off "$V" "${NETDEV:-}"; vm_quit "$V" 2>/dev/null; }
trap cleanup EXIT
"$VMDIR/build-image.sh" >"$OUT/build.log" 2>&1 || { say "VM image build failed"; exit 1; }
say "booting the VM"
vm_boot "$V" --id 1 --smp 2 --mem 1024 --timeout 3600 >/dev/null 2>>"$OUT/build.log" || { say "boot failed"; exit 1; }
SETUP='set -e
modprobe nfsd; modprobe rpcrdma
mount -t nfsd nfsd /proc/fs/nfsd
mkdir -p /export /run/rpcbind /var/lib/nfs/v4recovery
mount -t tmpfs -o size=400m tmpfs /export; chmod 1777 /export
echo "/export *(rw,no_root_squash,insecure,no_subtree_check,fsid=1)" > /etc/exports
rpcbind
exportfs -ra
rpc.mountd
rpc.nfsd 4
echo "rdma 20049" > /proc/fs/nfsd/portlist
cat /proc/fs/nfsd/portlist'
vm_exec "$V" "$SETUP" 120 >"$OUT/server-setup.log" 2>&1 || { cat "$OUT/server-setup.log"; say "server setup failed"; exit 1; }
# siw's network (eth1, 10.77.1.0/24), or rxe's with --rxe (eth0, 10.77.0.0/24).
SERVER=10.77.1.2 NETDEV=eth1 TRANSPORT=iwarp TAG=""
[ $RXE = 1 ] && SERVER=10.77.0.2 NETDEV=eth0 TRANSPORT=roce TAG="rxe-"
URL=nfs://$SERVER/export
if [ "$LOSS" != 0 ]; then
  net_loss_on "$V" "$NETDEV" "$SERVER" "$LOSS" || { say "could not set up the loss"; exit 1; }
  TAG="${TAG}loss$LOSS-"
fi

for proto in $PROTOS; do
  P="--proto $proto --transport $TRANSPORT -q"
  for size in $SIZES; do
    name=$TAG$proto-put-$size
    src=$OUT/src-$size back=$OUT/back-$size
    head -c "$size" /dev/urandom > "$src"
    [ "$proto" = rdma ] && cap_start "$OUT/$name.pcap"
    ok=1 why=""
    if ! H "$BIN" nfs $P put "$src" "$URL/f-$proto-$size" >"$OUT/$name.log" 2>&1; then ok=0 why="put failed: $(tail -1 "$OUT/$name.log")"
    elif ! H "$BIN" nfs $P get "$URL/f-$proto-$size" "$back" >>"$OUT/$name.log" 2>&1; then ok=0 why="get failed: $(tail -1 "$OUT/$name.log")"
    elif ! cmp -s "$src" "$back"; then ok=0 why="the file read back differs"
    else
      gm=$(vm_exec "$V" "md5sum < /export/f-$proto-$size" 60 | awk '{print $1}')
      hm=$(md5sum < "$src" | awk '{print $1}')
      [ "$gm" = "$hm" ] || { ok=0; why="the guest's md5 $gm is not ours $hm"; }
    fi
    if [ "$proto" = rdma ]; then
      cap_stop
      decode_check "$name" || { [ $ok = 1 ] && { ok=0; why="decode --strict failed (see $OUT/$name.decode)"; }; }
    fi
    record "$name" $ok "$why"
  done
  # ls: every file with its size.
  name=$TAG$proto-ls
  [ "$proto" = rdma ] && cap_start "$OUT/$name.pcap"
  ok=1 why=""
  if H "$BIN" nfs $P ls "$URL" >"$OUT/$name.log" 2>&1; then
    for size in $SIZES; do
      grep -qE "^- +$size f-$proto-$size\$" "$OUT/$name.log" || { ok=0; why="f-$proto-$size of $size octets not listed"; }
    done
  else ok=0 why="ls failed: $(tail -1 "$OUT/$name.log")"; fi
  [ "$proto" = rdma ] && cap_stop
  record "$name" $ok "$why"
  # A file the guest wrote, read back; its md5 is the guest's.
  name=$TAG$proto-guest-file
  gm=$(vm_exec "$V" "dd if=/dev/urandom of=/export/g-$proto bs=1000 count=777 2>/dev/null; md5sum < /export/g-$proto" 60 | awk '{print $1}')
  if H "$BIN" nfs $P get "$URL/g-$proto" "$OUT/g-$proto" >"$OUT/$name.log" 2>&1 &&
     [ "$(md5sum < "$OUT/g-$proto" | awk '{print $1}')" = "$gm" ]; then record "$name" 1 ""
  else record "$name" 0 "the guest's file did not come back intact ($(tail -1 "$OUT/$name.log"))"; fi
  # rm: gone for us and for the guest.
  name=$TAG$proto-rm
  ok=1 why=""
  for f in $(for s in $SIZES; do echo "f-$proto-$s"; done) "g-$proto"; do
    H "$BIN" nfs $P rm "$URL/$f" >>"$OUT/$name.log" 2>&1 || { ok=0; why="rm $f failed"; }
  done
  left=$(vm_exec "$V" "ls /export | grep -c -- '-$proto' || true" 30)
  [ "${left:-x}" = 0 ] || { ok=0; why="${why:-the guest still lists $left files}"; }
  if H "$BIN" nfs $P ls "$URL" >"$OUT/$name.ls" 2>&1 && grep -q -- "-$proto" "$OUT/$name.ls"; then
    ok=0; why="ls still lists removed files"
  fi
  record "$name" $ok "$why"
done

# The RDMA captures show every chunk type in use.
if echo "$PROTOS" | grep -qw rdma; then
  name=${TAG}rdma-chunks
  for f in "$OUT"/${TAG}rdma-*.pcap; do "$BIN" decode -v "$f"; done > "$OUT/chunks.txt" 2>&1
  ok=1 why=""
  for k in "read list\|read_list\|Read chunk" "write list\|write_list\|Write chunk" "reply chunk\|reply_chunk\|Reply chunk"; do
    grep -qi "$k" "$OUT/chunks.txt" || { ok=0; why="no message with ${k%%\\*} in the captures"; }
  done
  record "$name" $ok "$why"
  # RFC 8797: we advertise remote invalidation; nfsd answers calls whose chunks share one
  # handle with Send With Invalidate of it, and the next call still works.
  name=${TAG}rdma-remote-invalidate
  ok=1 why=""
  # iWARP's decode says "Send with Invalidate ... invalidate 0x..", RoCE's "Send Only (or
  # Last) with Invalidate ... invalidate R_Key 0x..".
  grep -qE "Send( Only| Last)? with Invalidate .*invalidate (R_Key )?0x" "$OUT/chunks.txt" ||
    { ok=0; why="no reply came by Send With Invalidate"; }
  record "$name" $ok "$why"
fi

summary interop-nfs
