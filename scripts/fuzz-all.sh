#!/usr/bin/env bash
# fuzz-all.sh - every fuzz target for S seconds each (default 300, issue 12 Done-when 6), J
# targets at a time (default 1; the machine has 2 cores), each on its corpus in fuzz/corpus/
# (kept in the repository) and the seeds scripts/fuzz-seeds.py cuts into fuzz/seeds/ (not
# kept: they come from fixtures/captures). After each run the corpus is minimised: the
# smallest set of inputs, old and new, seeds included, that covers what all of them cover
# (libFuzzer's -merge=1), replaces it.
#
#   scripts/fuzz-all.sh [--seconds S] [--jobs J] [--only REGEX] [--out DIR] [--no-minimise]
#
# cargo-fuzz needs libFuzzer's nightly flags: RUSTC_BOOTSTRAP=1 lets the stable toolchain take
# them (see the README). Prints PASS/FAIL per target (with the executions run); a crash leaves
# its input in fuzz/artifacts/TARGET/ and its log in DIR (default target/fuzz-all). Exits 0 only
# if no target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=300 JOBS=1 ONLY="" OUT=target/fuzz-all MINIMISE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECS=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --out) OUT=$2; shift ;;
    --no-minimise) MINIMISE=0 ;;
    -h|--help) awk 'NR>1 && /^#/ {sub(/^# ?/, ""); print; next} NR>1 {exit}' "$0"; exit 0 ;;
    *) echo "fuzz-all.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export RUSTC_BOOTSTRAP=1
cd fuzz
mapfile -t TARGETS < <(cargo fuzz list | grep -E "${ONLY:-.}")
echo "fuzz-all: ${#TARGETS[@]} targets, ${SECS}s each, $JOBS at a time" >&2
cargo fuzz build -O >&2
: >"$OUT/summary"

run() {
  local t=$1
  mkdir -p "corpus/$t" "seeds/$t"
  if cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- -max_total_time="$SECS" >"$OUT/$t.log" 2>&1; then
    echo "PASS  $t: $(grep -o 'Done [0-9]* runs' "$OUT/$t.log" | tail -1)$(minimise "$t")"
  else
    echo "FAIL  $t: see $OUT/$t.log"
  fi
}

minimise() {  # TARGET: corpus/TARGET becomes the merge of itself and seeds/TARGET
  local t=$1 tmp
  [ "$MINIMISE" = 1 ] || return 0
  tmp=$(mktemp -d "corpus/.$t.XXXXXX")
  if cargo fuzz run -O "$t" "$tmp" "corpus/$t" "seeds/$t" -- -merge=1 >"$OUT/$t.merge.log" 2>&1; then
    rm -rf "corpus/$t" && mv "$tmp" "corpus/$t"
    echo ", corpus minimised to $(find "corpus/$t" -type f | wc -l) inputs"
  else
    rm -rf "$tmp"
    echo ", corpus not minimised (see $OUT/$t.merge.log)"
  fi
}

for t in "${TARGETS[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  run "$t" | tee -a "$OUT/summary" &
done
wait
! grep -q '^FAIL' "$OUT/summary"
