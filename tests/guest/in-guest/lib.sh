# shellcheck shell=sh
# Test helpers for the guest suites (busybox sh).
#
#   t NAME FUNC      runs FUNC in a subshell with `set -e`, its output captured; prints
#                    "ok N NAME" or "not ok N NAME" followed by the output as "# " lines
#   fail MSG         ends the current test as failed with MSG
#   eq GOT WANT WHAT fails unless GOT = WANT
#   data KEY VALUE   hands a value to the host (a "#DATA KEY VALUE" console line)
#   mark NAME        tells the host a point was reached ("#MARK NAME"), then waits a moment so
#                    the host can take a snapshot of the daemon
#   must_fail_with TEXT CMD...  fails unless CMD fails and its stderr contains TEXT
T=0
exec 3>&1

t() {
    T=$((T + 1))
    _name="$1"; shift
    echo "#RUN $T $_name"
    ( set -e; "$@" ) >/tmp/test.out 2>&1
    _rc=$?
    if [ $_rc -eq 0 ]; then
        echo "ok $T $_name"
    else
        echo "not ok $T $_name"
        [ -s /tmp/test.out ] || echo "exit status $_rc" >/tmp/test.out
        tail -n 40 /tmp/test.out | sed 's/^/# /'
    fi
}

fail() { echo "FAIL: $*"; exit 1; }

eq() { [ "$1" = "$2" ] || fail "${3:-value}: got '$1', expected '$2'"; }

data() { echo "#DATA $*" >&3; }

mark() { echo "#MARK $1" >&3; sleep 1; }

must_fail_with() {
    _want="$1"; shift
    if "$@" 2>/tmp/err.out; then fail "'$*' succeeded, expected it to fail with '$_want'"; fi
    grep -q "$_want" /tmp/err.out || fail "'$*' failed with '$(cat /tmp/err.out)', expected '$_want'"
}

# wait_file PATH [SECONDS]: until PATH exists (made by the host, another process or another
# guest); fails the test after SECONDS (60).
wait_file() {
    _n=0
    while [ ! -e "$1" ]; do
        _n=$((_n + 1))
        [ $_n -gt $((${2:-60} * 10)) ] && fail "$1 did not appear within ${2:-60} s"
        sleep 0.1
    done
    return 0
}

# wait_gone PID SECONDS: until PID has exited; prints the milliseconds it took (0.05 s steps).
wait_gone() {
    _n=0
    while [ -d "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; do
        _n=$((_n + 1))
        [ $_n -gt $(($2 * 20)) ] && return 1
        sleep 0.05
    done
    echo $((_n * 50))
}
