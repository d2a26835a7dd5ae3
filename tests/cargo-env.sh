# shellcheck shell=bash
# The Rust toolchain for a root run of the tests, and the checkout given back afterwards
# (sourced by tests/run.sh and .ci/run, not run).
#
# `sudo tests/run.sh` runs as root with sudo's own PATH, which has no ~/.cargo/bin: a toolchain
# that rustup installed for the user who ran sudo is not found. find_cargo finds it and uses
# it read-only: that user's ~/.cargo/bin on PATH and ~/.rustup as RUSTUP_HOME, while cargo's
# own downloads and installs (the crates, cargo-fuzz) go to root's ~/.cargo, never into the
# user's home. give_back_checkout hands the files the run made in the checkout (target/, the
# fuzzing corpora) back to that user, so that a later build as the user can overwrite them.

# The oldest Rust that builds the daemon (Cargo.toml's rust-version, debian/control's rustc):
# tests/min-rust.sh builds and unit-tests it with Debian 13's cargo and rustc of that release.
RUST_MIN=1.85
# The release whose rustfmt and clippy are the lint gate (tests/run.sh: fmt --check and clippy
# -D warnings), named here only. Each new Rust release brings lints and deprecations of its own;
# with a pinned release they come into the gate when this line moves (and the code is made
# clean for them), not on the day rustup's stable moves. Builds and tests use whichever
# toolchain find_cargo finds: nothing pins a user's own `cargo build`.
RUST_LINT=1.95.0

# cargo_env_die MESSAGE...: what is missing and how to get it, then exit 1.
cargo_env_die() {
    printf '%s\n' "$@" >&2
    exit 1
}

# rust_version CARGO [RUSTUP_HOME]: the version CARGO reports ("1.85.0"), empty if it does not run.
rust_version() {
    if [ -n "${2:-}" ]; then
        RUSTUP_HOME="$2" "$1" --version 2>/dev/null | awk '{ print $2 }'
    else
        "$1" --version 2>/dev/null | awk '{ print $2 }'
    fi
}

# new_enough VERSION: VERSION is RUST_MIN or later.
new_enough() {
    [ -n "$1" ] && [ "$(printf '%s\n%s\n' "$RUST_MIN" "$1" | sort -V | head -n1)" = "$RUST_MIN" ]
}

# find_cargo: puts a cargo of Rust >= RUST_MIN first on PATH, or exits saying how to get one.
# Looks at the cargo on PATH, then root's ~/.cargo/bin (sudo's PATH leaves it out), then, under
# sudo, the ~/.cargo/bin of the user who ran sudo (with that user's ~/.rustup).
find_cargo() {
    local root_home user_home="" c found="" seen=""
    root_home="$(getent passwd 0 | cut -d: -f6)"
    if [ -n "${SUDO_UID:-}" ] && [ "${SUDO_UID}" != 0 ] && [ -n "${SUDO_USER:-}" ]; then
        user_home="$(getent passwd "$SUDO_USER" | cut -d: -f6)"
        # Whatever cargo builds or installs (the crates, cargo-fuzz) stays root's.
        export CARGO_HOME="${CARGO_HOME:-$root_home/.cargo}"
    fi
    for c in "$(command -v cargo 2>/dev/null)" "$root_home/.cargo/bin/cargo"; do
        if [ -z "$c" ] || [ ! -x "$c" ]; then continue; fi
        seen+="  $c: Rust $(rust_version "$c" || true)"$'\n'
        if new_enough "$(rust_version "$c")"; then found="$c"; break; fi
    done
    if [ -z "$found" ] && [ -n "$user_home" ] && [ -x "$user_home/.cargo/bin/cargo" ]; then
        c="$user_home/.cargo/bin/cargo"
        seen+="  $c: Rust $(rust_version "$c" "$user_home/.rustup" || true)"$'\n'
        if new_enough "$(rust_version "$c" "$user_home/.rustup")"; then
            found="$c"
            export RUSTUP_HOME="$user_home/.rustup"
            echo "# using $SUDO_USER's Rust toolchain read-only ($user_home/.cargo/bin," \
                "RUSTUP_HOME=$RUSTUP_HOME); cargo's downloads and installs go to $CARGO_HOME" >&2
        fi
    fi
    if [ -z "$found" ]; then
        local msg=("no cargo of Rust $RUST_MIN or later found (Debian 12's cargo is 1.63).")
        [ -n "$seen" ] && msg+=("Found, too old:" "${seen%$'\n'}")
        cargo_env_die "${msg[@]}" \
            "Get one:" \
            "  - rustup (https://rustup.rs), installed as root, or as the user who then runs" \
            "    'sudo tests/run.sh' (that user's ~/.cargo/bin/cargo is found and used);" \
            "  - on Debian 13: apt install cargo rustfmt rust-clippy (Rust 1.85)."
    fi
    # cargo-fuzz, when the run installs it, lands in $CARGO_HOME/bin: after the cargo found.
    PATH="$(dirname "$found")${CARGO_HOME:+:$CARGO_HOME/bin}:$PATH"
    export PATH
}

# need_fmt_clippy: cargo fmt and cargo clippy work, or the error saying how to add them.
need_fmt_clippy() {
    cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1 && return 0
    cargo_env_die "cargo fmt and cargo clippy are needed: rustup component add rustfmt clippy" \
        "(as the user whose toolchain it is), or on Debian 13 apt install rustfmt rust-clippy."
}

# lint_toolchain: sets LINT to "+RUST_LINT" when rustup has that toolchain with rustfmt and
# clippy (a toolchain of root's own rustup is installed when missing; a sudo user's rustup is
# only used, never changed), and to "" otherwise: then the lint stage runs the found toolchain's
# fmt and clippy, reports what they find, and fails on nothing a release other than RUST_LINT
# says.
# shellcheck disable=SC2034 # LINT is the caller's
lint_toolchain() {
    LINT=""
    command -v rustup >/dev/null 2>&1 || return 0
    # The probes never install (a sudo user's rustup must not be changed by root).
    if ! RUSTUP_AUTO_INSTALL=0 cargo "+$RUST_LINT" clippy --version >/dev/null 2>&1 ||
        ! RUSTUP_AUTO_INSTALL=0 cargo "+$RUST_LINT" fmt --version >/dev/null 2>&1; then
        if [ -z "${RUSTUP_HOME:-}" ] || [ "${RUSTUP_HOME}" = "$(getent passwd 0 | cut -d: -f6)/.rustup" ]; then
            echo "# installing Rust $RUST_LINT (rustfmt, clippy) for the lint gate" >&2
            rustup toolchain install "$RUST_LINT" --profile minimal --component rustfmt,clippy \
                >/dev/null 2>&1 || true
        fi
    fi
    if RUSTUP_AUTO_INSTALL=0 cargo "+$RUST_LINT" clippy --version >/dev/null 2>&1 &&
        RUSTUP_AUTO_INSTALL=0 cargo "+$RUST_LINT" fmt --version >/dev/null 2>&1; then
        LINT="+$RUST_LINT"
    fi
}

# The other target the lint gate runs clippy for: its types (c_char, nlink_t) and system call
# numbers differ from x86_64's, and debian/control builds it. Only its standard library is
# needed (clippy checks, it links nothing): no cross linker, no C toolchain.
LINT_CROSS=aarch64-unknown-linux-gnu

# lint_cross_target: succeeds when rustup's Rust RUST_LINT has LINT_CROSS's standard library,
# added to root's own rustup when missing (a sudo user's rustup is only used, never changed);
# otherwise says why on stderr and fails, and the caller skips that clippy run (a download
# that did not work fails no gate).
lint_cross_target() {
    command -v rustup >/dev/null 2>&1 || {
        echo "# no clippy for $LINT_CROSS: no rustup" >&2
        return 1
    }
    if ! rustup target list --installed --toolchain "$RUST_LINT" 2>/dev/null | grep -qx "$LINT_CROSS"; then
        if [ -n "${RUSTUP_HOME:-}" ] && [ "${RUSTUP_HOME}" != "$(getent passwd 0 | cut -d: -f6)/.rustup" ]; then
            echo "# no clippy for $LINT_CROSS: Rust $RUST_LINT of $RUSTUP_HOME has no standard library" \
                "for it, and a sudo user's rustup is not changed (rustup target add $LINT_CROSS" \
                "--toolchain $RUST_LINT, as that user)" >&2
            return 1
        fi
        echo "# adding $LINT_CROSS's standard library to Rust $RUST_LINT, for its clippy" >&2
        local err
        if ! err="$(rustup target add "$LINT_CROSS" --toolchain "$RUST_LINT" 2>&1)"; then
            echo "# no clippy for $LINT_CROSS: rustup target add $LINT_CROSS --toolchain $RUST_LINT" \
                "failed: $(printf '%s\n' "$err" | grep -m1 -i 'error' || printf '%s\n' "$err" | head -n 1)" >&2
            return 1
        fi
    fi
}

# give_back_checkout DIR: under sudo, when DIR belongs to the user who ran sudo, every file
# root owns below DIR (what this run made there: target/, tests/fuzz/corpus, ...) goes back to
# that user and group. Does not cross into other file systems mounted below DIR.
give_back_checkout() {
    local dir="$1"
    [ -n "${SUDO_UID:-}" ] && [ "${SUDO_UID}" != 0 ] && [ -n "${SUDO_GID:-}" ] || return 0
    [ "$(stat -c %u "$dir")" = "$SUDO_UID" ] || return 0
    find "$dir" -xdev -uid 0 -exec chown -h "$SUDO_UID:$SUDO_GID" {} + 2>/dev/null || true
}
