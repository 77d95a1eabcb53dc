#!/usr/bin/env bash
# Run the memory crate's tests and the loopback integration tests under valgrind memcheck
# (issue 3, Done-when 6). Exits non-zero on any memcheck error.
#   scripts/valgrind.sh            # 64 MiB test skipped (it takes ~150 s under valgrind)
#   scripts/valgrind.sh --all      # include it
set -euo pipefail
cd "$(dirname "$0")/.."
skip=(--skip sixty_four_mib)
[ "${1:-}" = "--all" ] && skip=()
export SOFTRDMA_TEST_TIMEOUT=${SOFTRDMA_TEST_TIMEOUT:-1200}
bin() { cargo test "$@" --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' | tail -1; }
mem=$(bin -p softrdma-memory --lib)
loop=$(bin -p softrdma --test loopback)
valgrind --tool=memcheck --error-exitcode=1 "$mem" --test-threads=1
valgrind --tool=memcheck --error-exitcode=1 "$loop" "${skip[@]}"
echo "valgrind: memory and loopback tests clean"
