#!/usr/bin/env bash
# The oldest Rust the project promises (rust-version in Cargo.toml, RUST_MIN in
# tests/cargo-env.sh, rustc in debian/control), built and tested instead of promised: Debian 13
# (trixie) ships cargo and rustc 1.85, so this builds the daemon with them in a trixie chroot,
# the README's way (cargo build --release --locked), and runs the daemon's unit tests there
# (cargo test --release --locked --lib --bins: the release profile, so that the dependencies
# are built once). rustup cannot fetch an old release here (no network but crates.io and
# Debian's archive), and a distribution's toolchain is the one a packager meets.
#
# Usage: tests/min-rust.sh [--refresh]
#   --refresh   make the chroot again (e.g. after a trixie point release)
#
# Needs root (mmdebstrap, chroot, mounts in a private mount namespace), deb.debian.org and
# crates.io. The chroot is made once, with mmdebstrap (installed from bookworm when missing),
# in /var/cache/virtiofsd-guest/trixie-rust (about 900 MB with the crates: cargo, rustc, gcc, libc6-dev) and
# reused by every later run; the crates cargo downloads stay in its /root/.cargo. The checkout
# is mounted read-only in it; cargo builds in CARGO_TARGET_DIR/min-rust (default
# target/min-rust). Nothing else on the host changes, and no mount outlives the run.
#
# Time on a 2-core machine: making the chroot 66 s (once); the release build and the unit
# tests from a clean target directory 4.6 min of CPU, 8.8 min of wall time while other builds
# ran beside them (load average 8): the build 359 s, the tests 169 s.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

REFRESH=0
while [ $# -gt 0 ]; do
    case "$1" in
        --refresh) REFRESH=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "min-rust.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "min-rust.sh: needs root (mmdebstrap, chroot and mounts)" >&2; exit 2; }

# shellcheck source=tests/cargo-env.sh
. "$ROOT/tests/cargo-env.sh"
CHROOT="${VIRTIOFSD_MIN_RUST_CHROOT:-/var/cache/virtiofsd-guest/trixie-rust}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
OUT="$TARGET/min-rust"

# The three places that name the minimum agree.
manifest_min="$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml")"
control_min="$(sed -n 's/.*rustc (>= \([0-9.]*\)).*/\1/p' "$ROOT/debian/control")"
if [ "$manifest_min" != "$RUST_MIN" ] || [ "$control_min" != "$RUST_MIN" ]; then
    echo "min-rust.sh: the minimum differs: Cargo.toml $manifest_min, tests/cargo-env.sh" \
        "$RUST_MIN, debian/control $control_min" >&2
    exit 1
fi

if [ "$REFRESH" = 1 ] || [ ! -x "$CHROOT/usr/bin/cargo" ]; then
    if ! command -v mmdebstrap >/dev/null; then
        echo "# installing mmdebstrap"
        apt_install() {
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y \
                --no-install-recommends mmdebstrap >/dev/null
        }
        # A fresh machine may have no package lists yet.
        apt_install || { apt-get -o DPkg::Lock::Timeout=900 update >/dev/null && apt_install; }
    fi
    echo "# making the trixie chroot with Debian's cargo and rustc in $CHROOT"
    rm -rf "$CHROOT.new"
    mkdir -p "$(dirname "$CHROOT")"
    mmdebstrap --variant=apt --include=cargo,rustc,gcc,libc6-dev,ca-certificates \
        --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
        trixie "$CHROOT.new" http://deb.debian.org/debian
    rm -rf "$CHROOT"
    mv "$CHROOT.new" "$CHROOT"
fi

version="$(chroot "$CHROOT" rustc --version)"
echo "# $version ($(chroot "$CHROOT" cargo --version)), Debian's, in $CHROOT"
case "$version" in
    "rustc $RUST_MIN."*) ;;
    *) echo "min-rust.sh: the chroot's rustc is not $RUST_MIN: $version (--refresh?)" >&2; exit 1 ;;
esac

mkdir -p "$OUT"
# In a mount namespace of its own: the mounts end with the run.
# shellcheck disable=SC2016 # expanded by the inner shell
unshare --mount --propagation private -- bash -euo pipefail -c '
    R="$1" SRC="$2" OUT="$3"
    mkdir -p "$R/src" "$R/out"
    # The chroot'"'"'s / a mount point, as a system'"'"'s is (tests that make their own mount
    # namespace set / private).
    mount --bind "$R" "$R"
    mount -t proc proc "$R/proc"
    mount --rbind /dev "$R/dev"
    mount -t tmpfs tmpfs "$R/tmp"
    mount --bind "$SRC" "$R/src"
    mount -o remount,bind,ro "$R/src"
    mount --bind "$OUT" "$R/out"
    # The host'"'"'s resolver and certificate authorities (a proxy'"'"'s own CA included) reach
    # crates.io the way the host'"'"'s cargo does.
    cp /etc/resolv.conf "$R/etc/resolv.conf"
    mount --bind /etc/ssl/certs "$R/etc/ssl/certs"
    mount -o remount,bind,ro "$R/etc/ssl/certs"
    run() {
        local start=$SECONDS
        echo "# $*"
        chroot "$R" env -i PATH=/usr/bin:/bin HOME=/root CARGO_HOME=/root/.cargo \
            CARGO_TARGET_DIR=/out CARGO_TERM_COLOR=never TMPDIR=/tmp \
            sh -c "cd /src && $*"
        echo "# ($((SECONDS - start)) s)"
    }
    run cargo build --release --locked --bin virtiofsd
    run /out/release/virtiofsd --version
    # --release: the dependencies built once, for both.
    run cargo test --release --locked --lib --bins
' min-rust "$CHROOT" "$ROOT" "$OUT"
echo "# Rust $RUST_MIN (Debian 13's cargo and rustc) builds the daemon and passes its unit tests"
