#!/usr/bin/env bash
# Builds the documentation of every workspace member, private items included, with every
# rustdoc warning an error: a link that does not resolve (`[name]` that names nothing in scope)
# and a public item's documentation that links to a private one both fail the build.
#
# Usage: tests/doc.sh   (as any user; tests/run.sh runs it after clippy)
#
# Needs cargo on PATH (tests/run.sh puts it there) and nothing else; takes about a minute once
# the dependencies are built. The pages land in target/doc (CARGO_TARGET_DIR/doc).
#
# Text that only looks like a link, such as the `[default]` of a clap `--help` line (the doc
# comment is the help text, verbatim), is allowed where it stands with
# `#[allow(rustdoc::broken_intra_doc_links)]` and a comment saying why.
set -euo pipefail
cd "$(dirname "$0")/.."

RUSTDOCFLAGS="-D warnings -D rustdoc::broken_intra_doc_links -D rustdoc::private_intra_doc_links" \
    cargo doc --workspace --no-deps --document-private-items --locked
