#!/usr/bin/env bash
# write-path.sh - the files of the workspace one RDMA Write's code runs in, on each
# transport (issue 44, Done-when 4: "from Qp::post_send to the socket and back to the CQ",
# fewer files and no returns). Runs the `write_path` example (a client connected to a
# server process over loopback, warm-up Writes, then one measured 4 KiB Write) under
# callgrind, instrumented over the measured Write only, and lists with
# scripts/write-path.py:
#   - from `Qp::post_send` (both transports): checked, into the engine, framed, written;
#     iWARP completes a Write once its last octet is written (RDMAP-80), so the CQ is
#     reached here too;
#   - RoCE, from a turn of whoever reads the socket (`RoceShared::turn`; it runs the
#     timers too): the ACK into the engine, the completion into the CQ;
# and the file-level calls that go back to a file already passed (0 is the goal).
# Built with optimisation and line tables, as users run it: a call the compiler inlined is
# not a call (`--inlined` to count its file anyway).
#
#   scripts/write-path.sh [--no-build] [--why] [--inlined] [--size BYTES]
#   WRITE_PATH_BIN=path/to/write_path scripts/write-path.sh --no-build   # another build
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=1 SIZE=4096 FLAGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) BUILD=0 ;;
    --why|--inlined) FLAGS+=("$1") ;;
    --size) SIZE=$2; shift ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 0 ;;
    *) echo "write-path.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
TARGET=${CARGO_TARGET_DIR:-target}/write-path
if [ "$BUILD" = 1 ]; then
  CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_TARGET_DIR=$TARGET \
    cargo build --release -q -p softrdma --example write_path >&2
fi
BIN=${WRITE_PATH_BIN:-$TARGET/release/examples/write_path}
ROOT=${WRITE_PATH_ROOT:-$PWD}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
[ -n "${WRITE_PATH_KEEP:-}" ] && trap - EXIT && echo "profiles in $OUT" >&2
python3 scripts/write-path.py --self-test >/dev/null
# Waits (up to 10 minutes) for a line `$2` from the client's output file `$1`.
wait_line() {
  for _ in $(seq 6000); do
    grep -qx "$2" "$1" 2>/dev/null && return 0
    kill -0 "$PID" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
for t in iwarp roce; do
  mkdir -p "$OUT/$t"
  # Instrumented only between `ready` and `done`: every thread of the client (whoever reads
  # the ACK), not the server (a child process, not traced). --separate-callers: a function
  # called on two paths is two nodes, so what a turn calls is not taken for what the post
  # calls.
  valgrind --tool=callgrind --demangle=no --separate-callers=64 --instr-atstart=no \
    --callgrind-out-file="$OUT/$t.out" \
    "$BIN" "$t" "$SIZE" --gate "$OUT/$t" >"$OUT/$t.log" 2>&1 &
  PID=$!
  wait_line "$OUT/$t.log" ready || { cat "$OUT/$t.log" >&2; exit 1; }
  callgrind_control -i on "$PID" >/dev/null 2>&1
  touch "$OUT/$t/go"
  wait_line "$OUT/$t.log" done || { cat "$OUT/$t.log" >&2; exit 1; }
  callgrind_control -i off "$PID" >/dev/null 2>&1
  touch "$OUT/$t/stop"
  wait "$PID" || { cat "$OUT/$t.log" >&2; exit 1; }
  entries=('^softrdma::qp::Qp::post_send$')
  # A turn of whoever reads the socket (the receive is inlined into it in some builds).
  [ "$t" = roce ] && entries+=('RoceShared>?::(turn|drain_now|drain_socket)$')
  echo "== $t: one $SIZE-octet RDMA Write"
  python3 scripts/write-path.py "$OUT/$t.out" "${entries[@]}" --root "$ROOT" "${FLAGS[@]}"
done
