#!/usr/bin/env bash
# Guest-level tests of the daemon: installs QEMU, busybox and the guest kernels if needed
# (tests/guest/install.sh), then boots guests against target/release/virtiofsd
# (tests/guest/run.sh). Arguments go to run.sh, e.g. --kernel all. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
tests/guest/install.sh
exec tests/guest/run.sh "$@"
