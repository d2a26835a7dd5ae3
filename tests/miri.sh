#!/usr/bin/env bash
# Miri over the node's unsafe code (src/passthrough/node/): the slab's unit tests and the node
# tables' that need no host file, under `cargo +nightly miri test`. Miri checks every access
# made through the slab's raw pointers, its counted references and the tables' slots against
# Rust's rules: a use after free, a double free, an access out of a chunk, an aliasing
# violation, a data race, a leak fail the stage. Under Miri the chunks come from the allocator
# (it models no mapping at an aligned address nor a partial unmap: `cfg(miri)` in slab.rs), and
# the free pages given back are zeroed by hand instead of by `madvise`.
#
# Usage: tests/miri.sh
#
# Needs rustup's nightly toolchain with its miri and rust-src components, which are added when
# missing. When they cannot be had (no rustup, no network for a download), or the Miri sysroot
# cannot be built, it prints "skipped: ..." and exits 0: a network problem does not fail the
# gate. Only the tests named in TESTS run (a filter): Miri runs code a thousand times slower,
# and cannot run the tests on the host's files (it has no `statx`, no `O_PATH`).
#
# Time on a 2-core machine: the first run builds Miri's sysroot and the dependencies for it
# (some minutes, once); afterwards the build is cached and the tests take some 30 s.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

# The tests Miri runs: the slab's (src/passthrough/node/slab.rs) and the tables' that need no
# host file (src/passthrough/node/tests.rs).
TESTS=(
    passthrough::node::slab::
    passthrough::node::tests::the_tables_hold_a_reference_an_entry_and_give_each_back
    passthrough::node::tests::ids_sharing_their_low_bits_do_not_share_a_slot
)

skip() {
    echo "skipped: tests/miri.sh: $*"
    exit 0
}

# shellcheck source=tests/cargo-env.sh
. "$ROOT/tests/cargo-env.sh"
find_cargo
command -v rustup >/dev/null 2>&1 || skip "no rustup, which Miri comes from (a nightly component)"
has_miri() {
    RUSTUP_AUTO_INSTALL=0 cargo +nightly miri --version >/dev/null 2>&1 &&
        rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'
}
if ! has_miri; then
    echo "# installing the nightly toolchain's miri and rust-src components" >&2
    if RUSTUP_AUTO_INSTALL=0 rustc +nightly --version >/dev/null 2>&1; then
        rustup component add miri rust-src --toolchain nightly >/dev/null 2>&1 || true
    else
        rustup toolchain install nightly --profile minimal --component miri,rust-src \
            >/dev/null 2>&1 || true
    fi
    has_miri || skip "no nightly toolchain with miri and rust-src from rustup (no network?)"
fi
cd "$ROOT"
cargo +nightly miri setup >/dev/null 2>&1 || skip "Miri's sysroot could not be built (cargo +nightly miri setup)"
echo "== $(cargo +nightly miri --version)"
cargo +nightly miri test --locked --lib -- "${TESTS[@]}"
