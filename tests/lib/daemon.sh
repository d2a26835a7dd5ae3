# shellcheck shell=bash
# The daemon under test (sourced, not run). ROOT is the checkout; prepare_daemon reports
# through report.sh, start_daemon tracks the daemon through proc.sh.
#
#   target_dir             prints cargo's target directory: CARGO_TARGET_DIR (made absolute
#                          from ROOT), else ROOT/target
#   build_daemon LOG       cargo build --release --bin virtiofsd in ROOT, its output to LOG
#   prepare_daemon LOG     with BUILD=1, build_daemon (a failed build is a failed test, and the
#                          end: finish); then DAEMON: DAEMON when set (made absolute), else
#                          the release build in target_dir. A DAEMON that is not an executable
#                          file is a failed test, and the end
#   start_daemon SOCK SHARE LOG [ARG...]
#                          "$DAEMON" --socket-path SOCK --shared-dir SHARE ARG... in the
#                          background, its output to LOG. DAEMON_ARGS (an array) come before
#                          the ARGs; DAEMON_PREFIX (an array, e.g. strace and its flags) is the
#                          command that runs the daemon. DPID is the background process, tracked
#   wait_socket SOCK [PID [SECONDS]]
#                          waits up to SECONDS (default 10) for the socket SOCK; fails when it
#                          does not come, at once when PID has exited

DAEMON_ARGS=()
DAEMON_PREFIX=()

target_dir() {
    local t="${CARGO_TARGET_DIR:-$ROOT/target}"
    case "$t" in /*) ;; *) t="$ROOT/$t" ;; esac
    echo "$t"
}

build_daemon() {
    (cd "$ROOT" && cargo build --release --bin virtiofsd) >"$1" 2>&1
}

prepare_daemon() {
    if [ "${BUILD:-1}" = 1 ]; then
        echo "# cargo build --release --bin virtiofsd"
        if ! build_daemon "$1"; then
            result fail "cargo build --release" "$(grep -E '^error' -A5 "$1" | head -n 40)
$(tail -n 5 "$1")"
            finish
        fi
    fi
    DAEMON="${DAEMON:-$(target_dir)/release/virtiofsd}"
    case "$DAEMON" in /*) ;; *) DAEMON="$PWD/$DAEMON" ;; esac
    if [ ! -f "$DAEMON" ] || [ ! -x "$DAEMON" ]; then
        result fail "daemon binary exists" "$DAEMON is missing or not executable"
        finish
    fi
}

start_daemon() {
    local sock="$1" share="$2" log="$3"
    shift 3
    "${DAEMON_PREFIX[@]}" "$DAEMON" --socket-path "$sock" --shared-dir "$share" \
        "${DAEMON_ARGS[@]}" "$@" >"$log" 2>&1 </dev/null &
    DPID=$!
    track "$DPID"
}

wait_socket() {
    local sock="$1" pid="${2:-}" i
    for ((i = 0; i < ${3:-10} * 20; i++)); do
        [ -S "$sock" ] && return 0
        [ -z "$pid" ] || kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.05
    done
    [ -S "$sock" ]
}
