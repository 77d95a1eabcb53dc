# bench-lib.sh - what the loopback benchmark scripts share: the build, the runs of every
# configuration (interleaved, beside a base build with --base) and the JSON they leave.
# Sourced; expects BUILD, RUNS, OUT, BASE (empty: none) and CONFIGS ("name|perf args").
bench_prepare() {
  [ "$BUILD" = 1 ] && cargo build --release -p softrdma-cli >&2
  BIN=${SOFTRDMA_BIN:-target/release/softrdma}
  mkdir -p "$OUT"
  rm -f "$OUT"/*.jsonl "$OUT"/errors.log
}
# Runs `perf --loopback --json ARGS... <configuration's args>` RUNS times per configuration,
# with BIN and then BASE, into OUT/NAME.jsonl and OUT/base:NAME.jsonl.
bench_runs() {
  local i c name args b tag
  for i in $(seq "$RUNS"); do
    for c in "${CONFIGS[@]}"; do
      name=${c%%|*} args=${c#*|}
      for b in "$BIN" ${BASE:+"$BASE"}; do
        tag=""
        [ "$b" != "$BIN" ] && tag="base:"
        # shellcheck disable=SC2086
        if ! "$b" perf --loopback --json "$@" $args >>"$OUT/$tag$name.jsonl" 2>>"$OUT/errors.log"; then
          echo "run $i of $tag$name failed (see $OUT/errors.log)" >&2
        fi
      done
    done
  done
}
