# shellcheck shell=bash
# The start of every QEMU-level test script (sourced first, not run): ROOT, the checkout, the
# other files of tests/lib (report.sh, proc.sh, daemon.sh, accel.sh, guest.sh), the defaults of
# the options every level has (BUILD=1, DAEMON unset, KEEP=0, VERBOSE=0), and:
#
#   common_option ARG...  takes the option at the front of ARG..., if it is one every level
#                         has; TAKEN is how many arguments it used (0, and status 1, when it
#                         is none of them):
#                           --daemon PATH   test this binary instead of building it
#                           --no-build      do not run cargo build (test the built binary)
#                           --keep          keep the work dir for inspection
#                           -v, --verbose   also print the diagnostics of passing tests
#                           -h, --help      usage
#   usage [STATUS]        the script's header comment (from its second line to its
#                         "set -uo pipefail"); exits STATUS (default 0)
#   bad_usage MESSAGE     "SCRIPT: MESSAGE" on stderr; exits 2
#   need_root WHY         exits 2 saying why the script needs root, unless it runs as root

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=tests/lib/report.sh
. "$ROOT/tests/lib/report.sh"
# shellcheck source=tests/lib/proc.sh
. "$ROOT/tests/lib/proc.sh"
# shellcheck source=tests/lib/daemon.sh
. "$ROOT/tests/lib/daemon.sh"
# shellcheck source=tests/lib/accel.sh
. "$ROOT/tests/lib/accel.sh"
# shellcheck source=tests/lib/guest.sh
. "$ROOT/tests/lib/guest.sh"

BUILD=1
DAEMON=""
KEEP=0
VERBOSE=0

usage() {
    sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d; /^# shellcheck /d; s/^# \{0,1\}//'
    exit "${1:-0}"
}

bad_usage() {
    echo "${0##*/}: $1" >&2
    exit 2
}

need_root() {
    [ "$(id -u)" = 0 ] || bad_usage "needs root ($1)"
}

# shellcheck disable=SC2034 # the variables are the caller's
common_option() {
    TAKEN=1
    case "$1" in
        --daemon)
            [ $# -ge 2 ] || bad_usage "--daemon takes a path"
            DAEMON="$2"; BUILD=0; TAKEN=2 ;;
        --daemon=*) DAEMON="${1#*=}"; BUILD=0 ;;
        --no-build) BUILD=0 ;;
        --keep) KEEP=1 ;;
        -v|--verbose) VERBOSE=1 ;;
        -h|--help) usage 0 ;;
        *) TAKEN=0; return 1 ;;
    esac
}
