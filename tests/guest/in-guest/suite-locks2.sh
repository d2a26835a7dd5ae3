# shellcheck shell=sh
# The two-guest locks suite (run.sh, boot locks-guests): two VMs, each with its own daemon, on
# one host directory, running at the same time; guest_role=a or b on the kernel command line.
# A holds flock, POSIX and OFD locks, B is refused, reads them with F_GETLK / F_OFD_GETLK and
# waits for them; A's holder exits and B's waiters wake; shared locks coexist across the
# guests; waiters killed in B go once A lets go; then, when run.sh made l2/sqlite-rows, both
# guests (and the host) commit SQLite transactions into one database (doc/locks.md). The
# guests meet through marker files in /mnt/l2/sync (the boot runs with --cache never: every
# look-up reaches the host). The host made /mnt/l2/*.f (run.sh, prepare_locks2).
L=/mnt/l2
S=$L/sync
role="$(sed -n 's/.*guest_role=\([ab]\).*/\1/p' /proc/cmdline)"
other=b
[ "$role" = b ] && other=a

# sig NAME: tells the other guest this guest reached NAME; meet NAME: sig, then waits for the
# other guest's NAME.
sig() { : > "$S/$role-$1"; }
meet() {
    sig "$1"
    wait_file "$S/$other-$1" "${2:-120}"
}

t_meet() { meet up 240; }

# A: holds every kind of lock (and shared ones) until B makes sync/a-release; the +close2 ones
# had another descriptor of their file opened and closed in A after the lock was taken.
t_a_holds() {
    rm -f /tmp/a-ready
    locks hold /tmp/a-ready "$S/a-release" \
        flock-ex $L/flock.f 0 0 posix-wr $L/posix.f 10 20 ofd-wr $L/ofd.f 0 0 \
        posix-wr $L/range.f 0 10 posix-wr $L/kill.f 0 0 flock-ex $L/kill.f 0 0 \
        flock-sh $L/sh-flock.f 0 0 posix-rd $L/sh-posix.f 0 0 ofd-rd $L/sh-ofd.f 0 0 \
        ofd-wr+close2 $L/close-ofd.f 0 0 posix-wr+close2 $L/close-posix.f 0 0 \
        flock-ex+close2 $L/close-flock.f 0 0 > /tmp/a-hold 2>&1 &
    h=$!
    wait_file /tmp/a-ready 20
    sig holds
    # The holder exits when B makes a-release; its exit drops the locks (FLUSH, RELEASE).
    wait_gone $h 300 > /dev/null || fail "the holder is still there"
    wait $h || fail "holder: $(cat /tmp/a-hold)"
}

t_b_refused() {
    wait_file "$S/a-holds" 120
    eq "$(locks try flock-ex $L/flock.f 0 0)" EAGAIN "flock -n against the other guest's flock"
    eq "$(locks try flock-sh $L/flock.f 0 0)" EAGAIN "shared flock against its exclusive one"
    eq "$(locks try posix-wr $L/posix.f 0 0)" EAGAIN "F_SETLK over the other guest's range"
    eq "$(locks try posix-rd $L/posix.f 15 1)" EAGAIN "F_SETLK read lock inside its range"
    eq "$(locks try ofd-wr $L/ofd.f 0 0)" EAGAIN "F_OFD_SETLK against its OFD lock"
    eq "$(locks try posix-rd $L/ofd.f 0 0)" EAGAIN "F_SETLK against its OFD lock"
    eq "$(locks try ofd-rd $L/posix.f 12 3)" EAGAIN "F_OFD_SETLK against its POSIX lock"
    # The holder is outside this guest: F_GETLK says pid 0 (doc/locks.md), F_OFD_GETLK -1.
    eq "$(locks getlk $L/posix.f 0 0)" "W 10 20 0" "F_GETLK of its POSIX lock"
    eq "$(locks ofdgetlk $L/posix.f 0 0)" "W 10 20 -1" "F_OFD_GETLK of its POSIX lock"
    eq "$(locks getlk $L/ofd.f 0 0)" "W 0 0 0" "F_GETLK of its OFD lock"
    eq "$(locks ofdgetlk $L/ofd.f 0 0)" "W 0 0 -1" "F_OFD_GETLK of its OFD lock"
    # flock and record locks do not conflict.
    eq "$(locks try posix-wr $L/flock.f 0 0)" ok "a record lock on its flock file"
}

t_b_ranges() {
    eq "$(locks try posix-wr $L/range.f 5 1)" EAGAIN "a byte inside its range 0-9"
    eq "$(locks try posix-wr $L/range.f 10 10)" ok "bytes 10-19 beside its range"
    eq "$(locks try posix-wr $L/posix.f 0 10)" ok "bytes before its range 10-29"
    eq "$(locks try ofd-wr $L/posix.f 30 5)" ok "an OFD lock after its range"
    eq "$(locks getlk $L/range.f 10 0)" unlocked "F_GETLK from byte 10 on"
}

t_b_shared() {
    eq "$(locks try flock-sh $L/sh-flock.f 0 0)" ok "shared flock beside its shared flock"
    eq "$(locks try flock-ex $L/sh-flock.f 0 0)" EAGAIN "exclusive flock beside its shared one"
    eq "$(locks try posix-rd $L/sh-posix.f 0 0)" ok "POSIX read lock beside its read lock"
    eq "$(locks try posix-wr $L/sh-posix.f 0 0)" EAGAIN "POSIX write lock over its read lock"
    eq "$(locks getlk $L/sh-posix.f 0 0)" "R 0 0 0" "F_GETLK of its read lock"
    eq "$(locks try ofd-rd $L/sh-ofd.f 0 0)" ok "OFD read lock beside its OFD read lock"
    eq "$(locks try ofd-wr $L/sh-ofd.f 0 0)" EAGAIN "OFD write lock over its OFD read lock"
}

# Closing another descriptor of the file in A dropped its POSIX lock only.
t_b_close_other() {
    eq "$(locks try ofd-wr $L/close-ofd.f 0 0)" EAGAIN "its OFD lock after another close"
    eq "$(locks try flock-ex $L/close-flock.f 0 0)" EAGAIN "its flock after another close"
    eq "$(locks try posix-wr $L/close-posix.f 0 0)" ok "its POSIX lock after another close"
}

# B waits for A's locks (and one waiter is killed), then lets A's holder go: the waiters wake.
t_b_waiters_wake() {
    locks wait posix-wr $L/posix.f 0 0 > /tmp/w-posix &
    wp=$!
    locks wait flock-ex $L/flock.f 0 0 > /tmp/w-flock &
    wf=$!
    locks wait ofd-wr $L/ofd.f 0 0 > /tmp/w-ofd &
    wo=$!
    locks wait posix-wr $L/kill.f 0 0 > /tmp/w-kill 2>&1 &
    wk=$!
    locks wait flock-ex $L/kill.f 0 0 > /tmp/w-killf 2>&1 &
    wkf=$!
    sleep 1
    for p in $wp $wf $wo $wk $wkf; do
        [ -d /proc/$p ] || fail "a waiter returned while the other guest holds: $(cat /tmp/w-*)"
    done
    kill -9 $wk $wkf
    sleep 1
    state="$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' /proc/$wk/status 2>/dev/null)"
    statef="$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' /proc/$wkf/status 2>/dev/null)"
    data killed-waiter-state "${state:-gone} ${statef:-gone}"
    # doc/locks.md: the killed waiter stays until its lock is granted, then goes.
    [ "$state" = D ] || fail "the killed F_SETLKW waiter is in state '${state:-gone}', not D, while A holds"
    [ "$statef" = D ] || fail "the killed flock waiter is in state '${statef:-gone}', not D, while A holds"
    : > "$S/a-release"
    ms="$(wait_gone $wk 30)" || fail "the killed F_SETLKW waiter is still there 30 s after the release"
    msf="$(wait_gone $wkf 30)" || fail "the killed flock waiter is still there 30 s after the release"
    data killed-waiter-gone-ms "$ms $msf"
    for p in $wp $wf $wo; do wait_gone $p 30 > /dev/null || fail "waiter $p not woken"; done
    for w in posix flock ofd; do
        case "$(cat /tmp/w-$w)" in got\ *) ;; *) fail "$w waiter: $(cat /tmp/w-$w)" ;; esac
        data "setlkw-wait-$w-ms" "$(sed 's/got //' /tmp/w-$w)"
    done
    eq "$(locks try posix-wr $L/kill.f 0 0)" ok "the killed F_SETLKW waiter's lock was dropped"
    eq "$(locks try flock-ex $L/kill.f 0 0)" ok "the killed flock waiter's lock was dropped"
}

# A once its holder is gone: B's waiters got the locks and exited (B marks it), so A gets them.
t_a_after() {
    wait_file "$S/b-woken" 120
    eq "$(locks try flock-ex $L/flock.f 0 0)" ok "flock after B's waiter exited"
    eq "$(locks try posix-wr $L/posix.f 0 0)" ok "POSIX lock after B's waiter exited"
    eq "$(locks try ofd-wr $L/ofd.f 0 0)" ok "OFD lock after B's waiter exited"
}

# SQLite, rollback journal: both guests and the host commit SQLITE_ROWS transactions each into
# one database at once (the host starts at A's mark); then every writer's rows are there.
t_sqlite() {
    [ -x /usr/bin/sqlite3 ] || fail "no sqlite3 in the initramfs"
    rows="$(cat $L/sqlite-rows)"
    meet sqlite-start 120
    [ "$role" = a ] && mark locks2-sqlite
    start=$(date +%s)
    { echo ".timeout 60000"; seq 1 "$rows" | sed "s/.*/INSERT INTO t VALUES ('guest-$role', &);/"; } |
        /usr/bin/sqlite3 $L/db.sqlite
    data sqlite-guest-s $(($(date +%s) - start))
    sig sqlite-done
    wait_file "$S/$other-sqlite-done" 600
    wait_file "$L/host-sqlite-done" 600
    eq "$(/usr/bin/sqlite3 $L/db.sqlite 'PRAGMA integrity_check;')" ok "integrity_check"
    eq "$(/usr/bin/sqlite3 $L/db.sqlite "SELECT who || ' ' || count(*) || ' ' || count(DISTINCT i) FROM t GROUP BY who ORDER BY who;" | tr '\n' ' ')" \
        "guest-a $rows $rows guest-b $rows $rows host $rows $rows " "rows per writer"
}

t locks2-guests-meet t_meet
if [ "$role" = a ]; then
    t locks2-a-holds-until-b-releases t_a_holds
    t locks2-a-gets-the-locks-after-b t_a_after
else
    t locks2-b-refused-by-a t_b_refused
    t locks2-b-disjoint-ranges-coexist t_b_ranges
    t locks2-b-shared-locks-coexist-exclusive-refused t_b_shared
    t locks2-b-close-of-another-fd-in-a t_b_close_other
    t locks2-b-waiters-wake-when-a-lets-go t_b_waiters_wake
    # (made here too: A's holder must end even when a test above failed before making it)
    : > "$S/a-release"
    sig woken
fi
# (run.sh gives the row count on the first kernel of the run only: SQLite under TCG is slow)
[ -f $L/sqlite-rows ] && t locks2-sqlite-two-guests-and-the-host t_sqlite
