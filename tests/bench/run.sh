#!/usr/bin/env bash
# Benchmarks this daemon against the reference virtiofsd (Rust virtiofsd 1.14) with
# virtiofsd-bench and prints a markdown table. A benchmark, not a test: tests/run.sh and CI do
# not run it.
#
# Usage: tests/bench/run.sh [more virtiofsd-bench flags, e.g. --rounds 5 --cache never]
# Environment (defaults in brackets):
#   REF_ROOT  where the reference is installed            [/opt/ref-virtiofsd]
#   TREE      the generated benchmark tree (≈ 400 MiB)     [/var/tmp/virtiofsd-bench-tree]
#   ROUNDS    rounds                                       [3]
# Installing the reference needs root (apt-get) and crates.io; the daemons run as the caller.
set -euo pipefail
cd "$(dirname "$0")/../.."

REF_ROOT=${REF_ROOT:-/opt/ref-virtiofsd}
TREE=${TREE:-/var/tmp/virtiofsd-bench-tree}
ROUNDS=${ROUNDS:-3}

echo "== building virtiofsd and virtiofsd-bench (release)" >&2
# The daemon as it ships (alone, as packaging/install.sh builds it), then the benchmark
# (crates/bench).
cargo build --release --locked --bin virtiofsd >&2
cargo build --release --locked -p virtiofsd-bench >&2

# shellcheck source=tests/bench/reference.sh
. tests/bench/reference.sh
ensure_reference

extra=()

mkdir -p target/bench
echo "== virtiofsd-bench (tree $TREE, $ROUNDS rounds)" >&2
target/release/virtiofsd-bench \
    --ours target/release/virtiofsd \
    --reference "$REF_ROOT/bin/virtiofsd" \
    --tree "$TREE" \
    --rounds "$ROUNDS" \
    --markdown \
    "${extra[@]}" "$@" | tee target/bench/result.md
echo "(table saved in target/bench/result.md)" >&2
