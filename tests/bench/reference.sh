# shellcheck shell=bash
# Sourced by tests/bench/run.sh and tests/bench/guest.sh: installs the reference virtiofsd
# (the virtio-fs project's Rust daemon) into $REF_ROOT when it is missing or another version.
# Needs root (apt-get for libseccomp-dev and libcap-ng-dev) and crates.io.

REF_VERSION=1.14.0
REF_ROOT=${REF_ROOT:-/opt/ref-virtiofsd}

ensure_reference() {
    if ! "$REF_ROOT/bin/virtiofsd" --version 2>/dev/null | grep -qF "$REF_VERSION"; then
        echo "== installing the reference virtiofsd $REF_VERSION into $REF_ROOT" >&2
        if ! dpkg -s libseccomp-dev libcap-ng-dev >/dev/null 2>&1; then
            apt-get update >&2
            apt-get install -y libseccomp-dev libcap-ng-dev >&2
        fi
        CARGO_TARGET_DIR=/tmp/ref-target cargo install virtiofsd --version "$REF_VERSION" \
            --root "$REF_ROOT" >&2
    fi
}
