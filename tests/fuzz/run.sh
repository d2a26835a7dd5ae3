#!/usr/bin/env bash
# Builds the fuzz targets and runs each for SECONDS (default 60) with a fixed seed.
# Fails (non-zero) as soon as a target crashes, panics, leaks or hangs (10 s per input).
#
#   tests/fuzz/run.sh [SECONDS]          all targets
#   TARGETS="queue_path" tests/fuzz/run.sh 30
#
# cargo-fuzz needs `-Z` flags; on a stable toolchain RUSTC_BOOTSTRAP=1 allows them. The address
# sanitizer is used when its runtime is available, otherwise SANITIZER=none (set it to force).
# Corpora go to tests/fuzz/corpus/<target>, crashes to tests/fuzz/artifacts/<target>/ (both
# ignored by git); the inputs under tests/fuzz/regressions/<target>/ seed every run. Reproduce a
# crash with:
#   RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir tests/fuzz <target> tests/fuzz/artifacts/<target>/<file>
set -euo pipefail

SECONDS_PER_TARGET="${1:-60}"
FUZZ_DIR="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$FUZZ_DIR/../.." && pwd)"
TARGETS="${TARGETS:-fuse_server queue_path passthrough_ops migration_state}"
SEED="${SEED:-1}"
export RUSTC_BOOTSTRAP=1

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi

cd "$ROOT"
build() {
    cargo fuzz build --fuzz-dir "$FUZZ_DIR" -O --sanitizer "$1"
}
if [[ -n "${SANITIZER:-}" ]]; then
    build "$SANITIZER"
elif build address; then
    SANITIZER=address
else
    echo "run.sh: address sanitizer build failed; falling back to --sanitizer none" >&2
    SANITIZER=none
    build none
fi

failed=()
for t in $TARGETS; do
    mkdir -p "$FUZZ_DIR/corpus/$t" "$FUZZ_DIR/artifacts/$t"
    # queue_path's input is a guest memory image (3 + 64 KiB); the others need far less.
    max_len=8192
    [[ "$t" == queue_path ]] && max_len=65539
    # migration_state's seeds hold deep chains and many ranges of stale ids.
    [[ "$t" == migration_state ]] && max_len=262144
    echo "=== $t: ${SECONDS_PER_TARGET}s, seed $SEED, sanitizer $SANITIZER"
    if ! cargo fuzz run --fuzz-dir "$FUZZ_DIR" -O --sanitizer "$SANITIZER" "$t" \
        "$FUZZ_DIR/corpus/$t" "$FUZZ_DIR/regressions/$t" -- \
        -seed="$SEED" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 \
        -rss_limit_mb=4096 -max_len="$max_len" -print_final_stats=1 \
        -artifact_prefix="$FUZZ_DIR/artifacts/$t/"; then
        failed+=("$t")
    fi
done

if ((${#failed[@]})); then
    echo "run.sh: FAILED: ${failed[*]} (see $FUZZ_DIR/artifacts/)" >&2
    exit 1
fi
echo "run.sh: all targets ran ${SECONDS_PER_TARGET}s without a crash"
