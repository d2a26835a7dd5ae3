# shellcheck shell=sh
# The locks suite: the guest's flock, POSIX and OFD locks against locks the host holds, held by
# the guest against the host, between processes of the guest, and a waiter killed while it
# waits (doc/locks.md). /mnt/locks/*.f are made by the host (run.sh, prepare_locks); the host
# takes and tests its locks at the marks (boot_mark) with the same helper.
L=/mnt/locks

t_host_holds() {
    mark locks-host-hold
    wait_file "$L/host-holds"
    eq "$(locks try flock-ex $L/flock.f 0 0)" EAGAIN "flock -n against the host's flock"
    eq "$(locks try flock-sh $L/flock.f 0 0)" EAGAIN "shared flock against the host's exclusive"
    eq "$(locks try posix-wr $L/posix.f 0 0)" EAGAIN "F_SETLK over the host's range"
    eq "$(locks try posix-rd $L/posix.f 15 1)" EAGAIN "F_SETLK read lock inside the host's range"
    eq "$(locks try posix-wr $L/posix.f 0 10)" ok "F_SETLK on bytes before the host's range"
    eq "$(locks try posix-wr $L/posix.f 30 5)" ok "F_SETLK on bytes after the host's range"
    eq "$(locks getlk $L/posix.f 0 0)" "W 10 20 0" "F_GETLK: the host's lock, pid 0"
    eq "$(locks try ofd-wr $L/ofd.f 0 0)" EAGAIN "F_OFD_SETLK against the host's OFD lock"
    eq "$(locks try posix-rd $L/ofd.f 0 0)" EAGAIN "F_SETLK against the host's OFD lock"
    got="$(locks ofdgetlk $L/ofd.f 0 0)"
    case "$got" in "W 0 0 "*) ;; *) fail "F_OFD_GETLK: got '$got'" ;; esac
    # flock and record locks do not conflict, on the host as in a local file system.
    eq "$(locks try posix-wr $L/flock.f 0 0)" ok "a record lock on the host's flock file"
}

t_setlkw_wakes() {
    locks wait posix-wr $L/posix.f 0 0 > /tmp/w-posix &
    wp=$!
    locks wait flock-ex $L/flock.f 0 0 > /tmp/w-flock &
    wf=$!
    locks wait ofd-wr $L/ofd.f 0 0 > /tmp/w-ofd &
    wo=$!
    sleep 1
    for p in $wp $wf $wo; do [ -d /proc/$p ] || fail "a waiter returned while the host holds"; done
    # Waiting requests hold up no other request (6.1 has one request queue).
    grep -q 'hello from the host' /mnt/fixtures/hello.txt || fail "read while waiting"
    ls /mnt/fixtures > /dev/null
    : > "$L/host-release"
    for p in $wp $wf $wo; do wait_gone $p 20 > /dev/null || fail "waiter $p not woken"; done
    for w in posix flock ofd; do
        case "$(cat /tmp/w-$w)" in got\ *) ;; *) fail "$w waiter: $(cat /tmp/w-$w)" ;; esac
        data "setlkw-wait-$w-ms" "$(sed 's/got //' /tmp/w-$w)"
    done
}

t_guest_holds() {
    rm -f /tmp/g-ready
    locks hold /tmp/g-ready - flock-ex $L/g-flock.f 0 0 posix-wr $L/g-posix.f 0 100 \
        ofd-wr $L/g-ofd.f 0 0 > /tmp/g-hold 2>&1 &
    h=$!
    wait_file /tmp/g-ready 10
    mark locks-guest-hold
    kill $h
    wait $h 2>/dev/null || true
    mark locks-guest-released
}

t_two_processes() {
    rm -f /tmp/a-ready
    locks hold /tmp/a-ready - posix-wr $L/range.f 0 10 flock-ex $L/range.f 0 0 \
        ofd-wr $L/ofd2.f 0 0 > /tmp/a-hold 2>&1 &
    a=$!
    wait_file /tmp/a-ready 10
    eq "$(locks try posix-wr $L/range.f 5 1)" EAGAIN "overlapping range of another process"
    eq "$(locks try posix-wr $L/range.f 20 10)" ok "disjoint range of another process"
    eq "$(locks try flock-ex $L/range.f 0 0)" EAGAIN "flock of another process"
    eq "$(locks try ofd-rd $L/ofd2.f 0 0)" EAGAIN "OFD lock of another process"
    eq "$(locks getlk $L/range.f 0 0)" "W 0 10 $a" "F_GETLK names the holding process"
    kill $a
    wait $a 2>/dev/null || true
    eq "$(locks try posix-wr $L/range.f 0 0)" ok "after the holder exited"
    eq "$(locks try flock-ex $L/range.f 0 0)" ok "flock after the holder exited"
    eq "$(locks try ofd-wr $L/ofd2.f 0 0)" ok "OFD lock after the holder exited"
}

t_killed_waiter() {
    rm -f /tmp/k-ready
    locks hold /tmp/k-ready - posix-wr $L/kill.f 0 0 > /tmp/k-hold 2>&1 &
    h=$!
    wait_file /tmp/k-ready 10
    locks wait posix-wr $L/kill.f 0 0 > /tmp/k-wait 2>&1 &
    w=$!
    sleep 1
    kill -9 $w
    sleep 1
    state="$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' /proc/$w/status 2>/dev/null)"
    data killed-waiter-state "${state:-gone}"
    # The rule (doc/locks.md): the wait goes on until the lock is granted; then the killed
    # process exits and its lock goes with it.
    [ "$state" = D ] || [ "$state" = Z ] || [ -z "$state" ] || fail "killed waiter in state $state"
    kill $h
    wait $h 2>/dev/null || true
    ms="$(wait_gone $w 20)" || fail "the killed waiter is still there 20 s after the release"
    data killed-waiter-gone-ms "$ms"
    eq "$(locks try posix-wr $L/kill.f 0 0)" ok "the killed waiter's lock was dropped"
}

# The semantics xfstests generic/478 (OFD against POSIX) and generic/504 (flock) check, as the
# guest sees them through this daemon (helpers/locks.c, semantics): OFD and POSIX locks of one
# process conflict, two open file descriptions are two OFD owners, closing another descriptor
# drops POSIX locks only, flock through a dup is the same lock, flock conversions. The pids
# F_GETLK and F_OFD_GETLK report are those of a FUSE client ("fuse"; doc/locks.md, F_GETLK).
t_semantics() {
    locks semantics $L/sem.f fuse > /tmp/sem.out 2>&1 || { grep -v '^ok ' /tmp/sem.out; fail "$(grep -c '^not ok' /tmp/sem.out) checks failed"; }
    echo "$(grep -c '^ok ' /tmp/sem.out) checks passed"
}

# SQLite (rollback journal) written by the host and by the guest at once, each transaction
# its own: no row lost and the database intact. Only with --cache never: in the other modes
# the guest may read pages of the database it cached before the host's last commit, which no
# lock can prevent (doc/locks.md).
t_sqlite() {
    [ -x /usr/bin/sqlite3 ] || fail "no sqlite3 in the initramfs"
    mark locks-sqlite
    start=$(date +%s)
    { echo ".timeout 60000"; seq 1 1000 | sed "s/.*/INSERT INTO t VALUES ('guest', &);/"; } |
        /usr/bin/sqlite3 $L/db.sqlite
    data sqlite-guest-s $(($(date +%s) - start))
    wait_file "$L/host-sqlite-done" 600
    eq "$(/usr/bin/sqlite3 $L/db.sqlite 'PRAGMA integrity_check;')" ok "integrity_check"
    eq "$(/usr/bin/sqlite3 $L/db.sqlite "SELECT count(*) FROM t WHERE who = 'guest';")" 1000 \
        "the guest's rows"
    eq "$(/usr/bin/sqlite3 $L/db.sqlite "SELECT count(*) FROM t WHERE who = 'host';")" 1000 \
        "the host's rows"
}

t locks-host-holds-refuse-the-guest t_host_holds
t locks-setlkw-wakes-when-the-host-releases t_setlkw_wakes
t locks-guest-holds-refuse-the-host t_guest_holds
t locks-two-processes-exclude-each-other t_two_processes
t locks-killed-waiter-ends-with-the-release t_killed_waiter
t locks-ofd-posix-flock-semantics-in-one-process t_semantics
guest_cache="$(sed -n 's/.*guest_cache=\([^ ]*\).*/\1/p' /proc/cmdline)"
[ "$guest_cache" = never ] && t locks-sqlite-host-and-guest-writers t_sqlite
