#!/usr/bin/env bash
# Runs every test level: formatting and lints, unit tests, in-process integration tests (a test
# frontend drives the real daemon over a unix socket), a bounded fuzzing run (60 s per target),
# guest tests under QEMU (Linux 6.12 and 6.1), virtme-ng booting a kernel on the host's root
# served by the daemon, live migration, reliability, packaging (the Debian package built,
# installed and purged again), and libvirt launching the daemon for a guest.
#
# Usage: sudo tests/run.sh       (or tests/run.sh in a root shell)
#
# Needs root (checked first: the daemon must create files as the guest's callers, the tests
# install packages and boot guests), Debian 12 (bookworm) on x86_64 with deb.debian.org and
# crates.io reachable, and Rust 1.85 or later with rustfmt and clippy. tests/cargo-env.sh finds
# cargo: on PATH, in root's ~/.cargo/bin, or under sudo in the ~/.cargo/bin of the user who ran
# sudo (used read-only); otherwise it says how to get one. The lint gate (fmt --check, clippy
# -D warnings) runs with the release pinned in tests/cargo-env.sh (RUST_LINT, through rustup,
# installed for root's own rustup when missing), so that a newer stable's new lints do not turn
# a run red; without rustup, or without that release, lints are reported and fail nothing. The
# minimum release (RUST_MIN) is built and unit-tested with Debian 13's cargo in a chroot
# (tests/min-rust.sh). Miri runs the node slab's and tables' unit tests (tests/miri.sh) with
# rustup's nightly toolchain, adding its miri component when missing (skipped when it cannot).
#
# Time: 20 to 30 minutes on a 2-core machine without KVM once everything is installed (the
# guest boots run under TCG; the minimum Rust's build and unit tests, 4.6 min of CPU, took 9 of
# them on a busy machine). The first run on a fresh machine also downloads and installs what
# is listed below, the crates, makes the trixie chroot (1 min), and builds cargo-fuzz.
#
# Lasting changes to the host, each made only when missing and left in place afterwards:
#   - apt sources: bookworm-backports (/etc/apt/sources.list.d/backports.sources), and
#     `apt-get update` (tests/guest/install.sh);
#   - packages: qemu-system-x86 10 from bookworm-backports, busybox-static, cpio, gcc,
#     libc6-dev, findutils, strace, xz-utils, make, tcc, stress-ng, fio, git, python3
#     (tests/guest/install.sh); uidmap (tests/it/rootless.rs); systemd, groff-base, man-db, the
#     shell linter shellcheck, libvirt-clients, libxml2-utils, debhelper, dpkg-dev, lintian
#     (tests/packaging.sh; the .deb it builds is installed and purged again in the run);
#     python3-venv, udev (which upgrades systemd to bookworm's latest), kmod, file
#     (tests/guest/virtme-ng.sh); mmdebstrap (tests/min-rust.sh);
#     libvirt-daemon, libvirt-daemon-driver-qemu, libvirt-clients (tests/libvirt/run.sh); with
#     what they pull in;
#   - guest kernels: Debian's newest 6.12 and 6.1 cloud kernels, unpacked into
#     /var/cache/virtiofsd-guest (tests/guest/install.sh); the whole 6.12 package with its
#     modules in /var/cache/virtiofsd-guest/kernel-6.12-vng, and a venv with virtme-ng from
#     PyPI in /var/cache/virtiofsd-guest (tests/guest/virtme-ng.sh);
#   - a Debian 13 (trixie) chroot with its cargo and rustc 1.85 in
#     /var/cache/virtiofsd-guest/trixie-rust, the crates it downloaded inside it
#     (tests/min-rust.sh);
#   - users: the system user and group virtiofsd-rootless, with 65,536 subordinate uids and gids
#     in /etc/subuid and /etc/subgid (tests/it/rootless.rs); the system user and group
#     libvirt-qemu (tests/libvirt/run.sh);
#   - directories libvirt uses: /var/log/libvirt/qemu, /var/lib/libvirt/qemu,
#     /var/cache/libvirt/qemu, /etc/libvirt (libvirtd itself runs with a configuration of its
#     own in a private mount namespace and is stopped at the end);
#   - root's ~/.cargo: the crates downloaded, and cargo-fuzz (cargo install); in root's own
#     rustup (not a sudo user's), Rust 1.95.0 with rustfmt and clippy, the lint gate's release
#     (RUST_LINT in tests/cargo-env.sh), when missing, and its aarch64 standard library (LINT_CROSS, for
#     clippy --target aarch64-unknown-linux-gnu), when missing; the nightly toolchain's miri and
#     rust-src components, and Miri's sysroot (tests/miri.sh), when missing;
#   - the checkout: target/ (builds, target/min-rust for the minimum Rust's, test output, guest
#     and libvirt logs), tests/fuzz/target/, tests/fuzz/corpus/ and tests/fuzz/artifacts/. Under sudo, every file the run made in the
#     checkout is given back to the user who ran sudo when it ends, so that the user's own
#     builds can overwrite them.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "tests/run.sh: needs root (the daemon has to chown and mknod for the guests; the tests" \
        "install packages and boot guests): sudo tests/run.sh" >&2
    exit 1
fi

# shellcheck source=tests/cargo-env.sh
. tests/cargo-env.sh
find_cargo
lint_toolchain
# The found toolchain's own rustfmt and clippy are needed only without the pinned release.
[ -n "$LINT" ] || need_fmt_clippy
trap 'give_back_checkout "$PWD"' EXIT
echo "== $(cargo --version), $(command -v cargo)"

if [ -n "$LINT" ]; then
    echo "== cargo $LINT fmt --check (the lint gate's pinned release, RUST_LINT in tests/cargo-env.sh)"
    cargo "$LINT" fmt --all -- --check

    echo "== cargo $LINT clippy -D warnings (the daemon as it ships, then the workspace: tests, frontend, benchmark)"
    cargo "$LINT" clippy --locked -- -D warnings
    cargo "$LINT" clippy --workspace --all-targets --locked -- -D warnings
    if lint_cross_target; then
        echo "== cargo $LINT clippy --target $LINT_CROSS -D warnings (its types and system call numbers; checked, not linked)"
        cargo "$LINT" clippy --target "$LINT_CROSS" --workspace --all-targets --locked -- -D warnings
    else
        echo "== no clippy for $LINT_CROSS (why: above); not failing"
    fi
    echo "== cargo $LINT doc (every member, private items too; warnings and broken links are errors)"
    RUSTUP_TOOLCHAIN="${LINT#+}" tests/doc.sh
else
    # No rustup with Rust $RUST_LINT (e.g. Debian's cargo): this release's lints are reported,
    # and fail nothing, as they may be lints Rust $RUST_LINT does not have or judges otherwise.
    echo "== cargo fmt --check and cargo clippy, reported only: no Rust $RUST_LINT (the lint gate's release) from rustup"
    cargo fmt --all -- --check || echo "# (not failing: formatting as this rustfmt sees it, not $RUST_LINT's)"
    cargo clippy --workspace --all-targets --locked ||
        echo "# (not failing: clippy of $(cargo --version), not of Rust $RUST_LINT)"
    tests/doc.sh || echo "# (not failing: rustdoc of $(cargo --version), not of Rust $RUST_LINT)"
fi

echo "== unit and in-process integration tests (the daemon's, the test frontend's, the benchmark's)"
# The daemon's integration tests drive it through the test frontend (crates/frontend).
mkdir -p target && cargo test --workspace --locked --all-targets 2>&1 | tee target/test-output.txt

echo "== a hostile guest takes and drops a million locks: descriptors and memory stay flat (release build)"
cargo test --release --locked --test it -- --ignored locks::a_million_lock_cycles --nocapture

echo "== Miri: the node's slab and tables under cargo +nightly miri test (tests/miri.sh; skipped without rustup's nightly miri)"
tests/miri.sh

echo "== the minimum Rust ($RUST_MIN): Debian 13's cargo and rustc in a trixie chroot build the daemon and run its unit tests (tests/min-rust.sh)"
tests/min-rust.sh

echo "== fuzzing: each cargo-fuzz target for 60 s (a crash leaves its input in tests/fuzz/artifacts/)"
tests/fuzz/run.sh 60

# The QEMU-level stages below are entered the same way: each tests this release build
# (--no-build) and prints "ok N ..." / "not ok N ..." lines and "P passed, F failed".
echo "== the daemon under test: cargo build --release --bin virtiofsd"
cargo build --release --locked --bin virtiofsd

echo "== the guest kit: QEMU 10, busybox, the guest kernels and tools (tests/guest/install.sh)"
tests/guest/install.sh

echo "== guest tests (QEMU + Linux 6.12 and 6.1 guests)"
tests/guest/run.sh --kernel all --no-build

echo "== live migration: two QEMUs, two daemons, QMP migrate (6.12 guest)"
tests/guest/migrate.sh --no-build

echo "== virtme-ng: vng boots the 6.12 kernel on the host's / served by this daemon (unprivileged, TCG)"
tests/guest/virtme-ng.sh --no-build

echo "== reliability under load and faults: short forms (the long ones: tests/guest/reliability.sh --long)"
tests/guest/reliability.sh --no-build

echo "== packaging: install layout, systemd units, man page, socket activation, examples; the .deb built, installed, booted by libvirt, purged"
tests/packaging.sh --no-build

echo "== real client: libvirt launches this daemon for a TCG guest"
tests/libvirt/run.sh --no-build
