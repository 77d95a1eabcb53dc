#!/usr/bin/env bash
# valgrind-capi.sh - Debian's ibv_rc_pingpong and ib_send_lat (RoCE) and rping (iWARP) pairs on the drop-in
# C ABI, every process under valgrind memcheck (issue 43, Done-when 6). Exits non-zero on any
# memcheck error or a failed pair. Needs valgrind, ibverbs-utils and rdmacm-utils.
#   scripts/valgrind-capi.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = "--no-build" ] || cargo build -p softrdma-capi --lib >/dev/null
LIB=$PWD/target/debug/libsoftrdma_capi.so
DIR=$(mktemp -d); trap 'rm -rf "$DIR"' EXIT
for n in libibverbs librdmacm libmlx5 libefa; do ln -s "$LIB" "$DIR/$n.so.1"; done
export LD_LIBRARY_PATH=$DIR
VG=(valgrind --tool=memcheck --error-exitcode=9 --quiet)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
listening() { # port: wait (up to 120 s: valgrind starts slowly) until something listens
  local hex; hex=$(printf ':%04X ' "$1")
  for _ in $(seq 1 1200); do grep -q "$hex.* 0A " /proc/net/tcp && return 0; sleep 0.1; done
  echo "nothing listens on $1" >&2; return 1; }
pair() { # name, server command..., --, client command...
  local name=$1; shift; local srv=() cli=()
  while [ "$1" != -- ]; do srv+=("$1"); shift; done; shift; cli=("$@")
  "${VG[@]}" --log-file="$DIR/$name-server.vg" "${srv[@]}" >"$DIR/$name-server.out" 2>&1 &
  local spid=$!
  listening "$PORT"
  "${VG[@]}" --log-file="$DIR/$name-client.vg" "${cli[@]}" >"$DIR/$name-client.out" 2>&1
  wait "$spid"
  if grep -q "ERROR SUMMARY: [1-9]" "$DIR/$name"-*.vg 2>/dev/null || [ -s "$DIR/$name-server.vg" ] || [ -s "$DIR/$name-client.vg" ]; then
    cat "$DIR/$name"-*.vg; echo "valgrind-capi: $name: memcheck errors" >&2; exit 1
  fi
  echo "valgrind-capi: $name pair clean"
}
DEV=softrdma_roce_lo
PORT=$(free_port)
pair rc_pingpong ibv_rc_pingpong -d "$DEV" -g 0 -p "$PORT" -n 50 -c -- \
  ibv_rc_pingpong -d "$DEV" -g 0 -p "$PORT" -n 50 -c 127.0.0.1
PORT=$(free_port)
pair rping rping -s -a 127.0.0.1 -p "$PORT" -C 20 -V -- rping -c -a 127.0.0.1 -p "$PORT" -C 20 -V
# ib_send_lat: perftest's own QP bring-up and polling (it turns inline and the ibv_wr_* calls off
# on a device it does not know; scripts/valgrind.sh memchecks capi's test of both).
PORT=$(free_port)
pair send_lat ib_send_lat -d "$DEV" -x 0 -n 100 -p "$PORT" -- \
  ib_send_lat -d "$DEV" -x 0 -n 100 -p "$PORT" 127.0.0.1
