#!/usr/bin/env bash
# Runs every test level: formatting and lints, unit tests, in-process integration tests
# (a test frontend drives the real daemon over a unix socket), and guest tests when present.
# Usage: tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --all-targets --locked -- -D warnings

echo "== unit and in-process integration tests"
cargo test --locked --all-targets 2>&1 | tee target/test-output.txt
