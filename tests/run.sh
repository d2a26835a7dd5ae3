#!/usr/bin/env bash
# Runs every test level: formatting and lints, unit tests, in-process integration tests
# (a test frontend drives the real daemon over a unix socket), a bounded fuzzing run, and guest
# tests under QEMU.
# Usage: tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (the daemon alone, then with the test frontend)"
cargo clippy --all-targets --locked -- -D warnings
cargo clippy --all-targets --locked --features test-utils -- -D warnings

echo "== unit and in-process integration tests"
# The integration tests drive the daemon through the test frontend (feature test-utils).
mkdir -p target && cargo test --locked --all-targets --features test-utils 2>&1 | tee target/test-output.txt

echo "== fuzzing: each cargo-fuzz target for 60 s (a crash leaves its input in tests/fuzz/artifacts/)"
tests/fuzz/run.sh 60

echo "== guest tests (QEMU + Linux 6.12 and 6.1 guests)"
if [ "$(id -u)" -ne 0 ]; then
    echo "guest tests need root (they install QEMU and run the daemon as root)" >&2
    exit 1
fi
tests/guest-run.sh --kernel all

echo "== live migration: two QEMUs, two daemons, QMP migrate (6.12 guest)"
tests/guest/migrate.sh --no-build

echo "== virtme-ng: vng boots the 6.12 kernel on the host's / served by this daemon (unprivileged, TCG)"
tests/guest/virtme-ng.sh --no-build

echo "== reliability under load and faults: short forms (the long ones: tests/guest/reliability.sh --long)"
tests/guest/reliability.sh --no-build

echo "== packaging: install layout, systemd units, man page, socket activation, examples"
tests/packaging.sh

echo "== real client: libvirt launches this daemon for a TCG guest"
tests/libvirt/run.sh
