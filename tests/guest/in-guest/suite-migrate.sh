# shellcheck shell=sh
# Live migration suite (tests/guest/migrate.sh): sourced by /init with the share on /mnt.
# Phase 1 runs on the source VM: it leaves the guest holding files open for reading and
# writing, a directory handle in the middle of a listing, its working directory in the share
# and a cached tree, then marks "ready". Phase 2 reads a large file in a loop (page cache
# dropped each time, so every read goes to the daemon) until the host signals that the
# migration is over: it creates files in the share's own tmpfs, which the guest sees as fewer
# free inodes in statfs (never cached by the guest). Phase 3 runs on the destination VM: every
# held thing still works, and new work lands on the host.

guest_error=0
grep -q 'guest_migrate_error=1' /proc/cmdline && guest_error=1

t_setup() {
    mkdir -p /mnt/work/dir
    dd if=/dev/urandom of=/mnt/work/big bs=1M count=8 2>/dev/null
    dd if=/dev/urandom of=/mnt/work/big2 bs=1M count=8 2>/dev/null
    sha256sum /mnt/work/big | cut -d' ' -f1 > /tmp/big.sha
    sha256sum /mnt/work/big2 | cut -d' ' -f1 > /tmp/big2.sha
    data big_sha256 "$(cat /tmp/big.sha)"
    i=0
    while [ $i -lt 300 ]; do : > "/mnt/work/dir/e$i"; i=$((i + 1)); done
    echo "read me" > /mnt/work/held-r
    echo "line 1" > /mnt/work/held-w
    echo "victim" > /mnt/work/victim
}
t migrate-setup t_setup

# Locks held across the migration by a process that keeps running on the destination: a flock
# and a fcntl (POSIX) write lock, on files of the share. The host probes them after the
# switch-over once the source daemon is gone (refused: the destination holds them), then again
# once this guest let them go (taken).
echo lock > /mnt/work/lock-flock
echo lock > /mnt/work/lock-posix
/helpers/locks hold /tmp/locks-ready /tmp/locks-release flock-ex /mnt/work/lock-flock 0 0 \
    posix-wr /mnt/work/lock-posix 0 100 > /tmp/locks-hold 2>&1 &
lockhold=$!
n=0
while [ ! -e /tmp/locks-ready ] && [ $n -lt 100 ]; do n=$((n + 1)); sleep 0.1; done

# Held across the migration by this shell: fd 5 appends, fd 6 reads, fd 7 the victim.
exec 5>>/mnt/work/held-w 6</mnt/work/held-r 7</mnt/work/victim
cd /mnt/work
find /mnt/work/dir > /dev/null
/helpers/dirhold /mnt/work/dir /tmp/dir-go > /tmp/dirhold.out 2>&1 &
dirhold=$!
sleep 1
free_before="$(stat -f -c %d /mnt)"
echo "# held: fds 5 6 7, cwd $(pwd), dirhold $(cat /tmp/dirhold.out), free inodes $free_before"
mark ready

# Two files read in turn, the page cache dropped before each read: the guest pages a read fills
# held the other file's data before, so a page the destination got before the daemon filled it
# shows as a wrong checksum.
reads=0
bad=0
last=big
while :; do
    echo 3 > /proc/sys/vm/drop_caches
    last=big; [ $((reads % 2)) = 1 ] && last=big2
    sum="$(sha256sum /mnt/work/$last | cut -d' ' -f1)"
    [ "$sum" = "$(cat /tmp/$last.sha)" ] || { bad=$((bad + 1)); echo "# read $reads: sha $sum"; }
    reads=$((reads + 1))
    now="$(stat -f -c %d /mnt)"
    [ $((free_before - now)) -ge 50 ] && break
    [ $reads -ge 2000 ] && break
done
echo "# $reads reads of the 8 MiB file during the migration, $bad wrong"
data reads_during "$reads"

t_loop() {
    [ $((free_before - $(stat -f -c %d /mnt))) -ge 50 ] || fail "the host never signalled the end of the migration"
    eq "$bad" 0 "reads with wrong data during the migration"
}
t migrate-reads-correct-during t_loop

t_locks() {
    [ -e /tmp/locks-ready ] || fail "the locks were never taken: $(cat /tmp/locks-hold)"
    [ -d /proc/$lockhold ] || fail "the lock holder is gone: $(cat /tmp/locks-hold)"
    : > /tmp/locks-release
    n=0
    while [ -d /proc/$lockhold ] && ! grep -q '^State:.*Z' /proc/$lockhold/status 2>/dev/null; do
        n=$((n + 1)); [ $n -gt 100 ] && fail "the lock holder did not exit"
        sleep 0.1
    done
    # The host probes again now, and says so with 50 more files than the 100 that ended the
    # migration (fewer free inodes: 140 counts the second batch whatever else changed).
    mark locks-released
    n=0
    while [ $((free_before - $(stat -f -c %d /mnt))) -lt 140 ]; do
        n=$((n + 1)); [ $n -gt 600 ] && fail "the host never probed the released locks"
        sleep 0.1
    done
    return 0
}
t migrate-locks-held-then-released t_locks

t_cached_big() {
    # Filled by the last reads before the switch-over (daemon writes into guest memory that
    # only the dirty log tells QEMU about), checked here without reading again.
    eq "$(sha256sum /mnt/work/$last | cut -d' ' -f1)" "$(cat /tmp/$last.sha)" "$last from the page cache"
}
t migrate-page-cache-filled-before-switch-over t_cached_big

t_after_big() {
    echo 3 > /proc/sys/vm/drop_caches
    eq "$(sha256sum /mnt/work/big | cut -d' ' -f1)" "$(cat /tmp/big.sha)" "big file after"
}
t migrate-big-file-after t_after_big

t_held_write() {
    echo "line 2 after migration" >&5
    sync
    eq "$(cat /mnt/work/held-w | tr '\n' '|')" "line 1|line 2 after migration|" "held-w"
}
t migrate-held-write-fd t_held_write

t_held_read() {
    eq "$(cat <&6)" "read me" "held-r through the open fd"
}
t migrate-held-read-fd t_held_read

t_cwd() {
    eq "$(pwd)" /mnt/work "cwd"
    echo "made in cwd" > created-after
    eq "$(cat /mnt/work/created-after)" "made in cwd" "file made relative to cwd"
    ls . | grep -q '^big$' || fail "listing of cwd lacks big"
}
t migrate-cwd t_cwd

t_dir_handle() {
    touch /tmp/dir-go
    # (started by the suite's shell, so not waited for from this test's subshell)
    n=0
    while ! grep -q '^duplicates' /tmp/dirhold.out; do
        n=$((n + 1)); [ $n -gt 300 ] && fail "dirhold did not finish: $(cat /tmp/dirhold.out)"
        sleep 0.1
    done
    cat /tmp/dirhold.out
    grep -q '^total 302$' /tmp/dirhold.out || fail "listing across the migration: $(cat /tmp/dirhold.out)"
    grep -q '^duplicates 0$' /tmp/dirhold.out || fail "duplicates"
}
t migrate-dir-handle-mid-listing t_dir_handle

t_tree() {
    eq "$(find /mnt/work/dir | wc -l)" 301 "cached tree"
    mkdir /mnt/work/newdir
    echo new > /mnt/work/newdir/new.txt
    eq "$(cat /mnt/work/newdir/new.txt)" new "new file"
    rm /mnt/work/dir/e0
    [ ! -e /mnt/work/dir/e0 ] || fail "e0 still there"
    sync
}
t migrate-new-work t_tree

if [ $guest_error = 1 ]; then
    t_victim() {
        # Deleted on the host during the migration: an error on that file, nothing else.
        if cat <&7 > /tmp/v.out 2>&1; then
            [ ! -s /tmp/v.out ] || fail "the deleted file still read: $(cat /tmp/v.out)"
        fi
        if cat /mnt/work/victim > /tmp/v2.out 2>&1; then fail "victim opened by name"; fi
        cat /tmp/v2.out
        eq "$(cat /mnt/work/held-r)" "read me" "another file"
    }
    t migrate-deleted-file-fails-alone t_victim
fi
exec 5>&- 6<&- 7<&-
cd /
