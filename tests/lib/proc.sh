# shellcheck shell=bash
# Processes and clean-up of the QEMU-level tests (sourced, not run). Sourcing it sets the
# traps: at exit (INT and TERM exit with status 130 first) every process still tracked is
# killed with every process below it, so that no daemon, QEMU or helper outlives the script;
# then the at_exit commands run, in the order given; then the work dir is removed (with KEEP=1
# it is kept and named).
#
#   track PID            PID, a process this shell started, is killed at exit
#   forget_pid PID       PID was reaped: no longer tracked
#   kill_tree PID [SIG]  SIG (default KILL) to PID and every process below it (a daemon's
#                        serving child, a daemon under strace or under an activator): all are
#                        found first, then signalled at once
#   kill_tracked         kill_tree for every tracked process still running (a subshell that
#                        tracked its own calls it before it ends)
#   reap PID SECONDS     waits up to SECONDS for PID, a child of this shell, to exit, and reaps
#                        it. REAPED is its exit status, or "running" when it was still running
#                        (then it has been killed with kill_tree). PID is no longer tracked.
#   at_exit COMMAND      COMMAND (one string) runs at exit, after the kills
#   work_dir PREFIX [PARENT]  WORK: a new directory PARENT/PREFIX.XXXXXX (PARENT defaults to
#                        TMPDIR, else /tmp), removed at exit

PIDS=()
EXIT_COMMANDS=()
WORK=""
REAPED=""

track() { PIDS+=("$1"); }

forget_pid() {
    local p new=()
    for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || new+=("$p"); done
    PIDS=("${new[@]}")
}

kill_tree() {
    local all=("$1") i=0 c
    while [ "$i" -lt "${#all[@]}" ]; do
        for c in $(cat /proc/"${all[$i]}"/task/*/children 2>/dev/null); do all+=("$c"); done
        i=$((i + 1))
    done
    kill -"${2:-KILL}" "${all[@]}" 2>/dev/null
    return 0
}

kill_tracked() {
    local p
    for p in "${PIDS[@]}"; do
        kill -0 "$p" 2>/dev/null && kill_tree "$p"
    done
    return 0
}

# shellcheck disable=SC2034 # REAPED is for the caller
reap() {
    local pid="$1" i
    for ((i = 0; i < $2 * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill_tree "$pid"
        { wait "$pid"; } 2>/dev/null
        REAPED=running
    else
        { wait "$pid"; } 2>/dev/null
        REAPED=$?
    fi
    forget_pid "$pid"
}

at_exit() { EXIT_COMMANDS+=("$1"); }

work_dir() {
    local parent="${2:-${TMPDIR:-/tmp}}"
    WORK="$(mktemp -d "${parent%/}/$1.XXXXXX")"
}

# The EXIT trap. The probe boot of accel.sh (KVM_PROBE_PID) is killed too, if one runs.
exit_cleanup() {
    local c
    [ -z "${KVM_PROBE_PID:-}" ] || kill -KILL "$KVM_PROBE_PID" 2>/dev/null
    kill_tracked
    for c in "${EXIT_COMMANDS[@]}"; do eval "$c"; done
    if [ -n "$WORK" ]; then
        if [ "${KEEP:-0}" = 1 ]; then echo "# work dir kept: $WORK"; else rm -rf "$WORK"; fi
    fi
}
trap exit_cleanup EXIT
trap 'exit 130' INT TERM
