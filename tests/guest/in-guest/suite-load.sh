# shellcheck shell=sh
# Load suite (tests/guest/reliability.sh): stress-ng file-system stressors with --verify and
# fio with verify=crc32c, on /mnt (daemon without a thread pool) and then /mnt2 (tag "pool",
# daemon --thread-pool-size 4), both with two request queues on a 2-vCPU guest. The guest then
# writes files with a sha256 list and syncs; the host checks them and fio's files. Marks: idle
# (before the load), loaded (right after it), after (the guest removed its temporary files and
# dropped its caches, so it has forgotten the inodes the load made).
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p"; }
SECS="$(arg rel_secs)"
FIO_MB="$(arg rel_fio_mb)"
STRESSORS="dir dentry link symlink rename xattr fallocate copy-file seek sync-file iomix"

t_mount_pool() {
    mkdir -p /mnt2
    mount -t virtiofs pool /mnt2
}
t mount-second-share t_mount_pool
sync; echo 3 > /proc/sys/vm/drop_caches
mark idle

# stress_on DIR: every stressor with one instance each (11 processes at once), verified.
stress_on() {
    args=""
    for s in $STRESSORS; do args="$args --$s 1"; done
    mkdir -p "$1/stress"
    # shellcheck disable=SC2086
    /usr/bin/stress-ng --temp-path "$1/stress" $args --verify --timeout "${SECS}s" \
        --metrics-brief --keep-name > /tmp/stress.out 2>&1
    rc=$?
    tail -n 25 /tmp/stress.out
    grep -q 'successful run completed' /tmp/stress.out || fail "stress-ng did not complete"
    ! grep -qiE 'fail|verif.*error|error:' /tmp/stress.out || fail "stress-ng reported a failure"
    [ "$rc" = 0 ] || fail "exit status $rc"
    # bogo operations per stressor, for doc/reliability.md
    data "stress_ops_$(basename "$1")" "$(sed -n 's/.*metrc: \[[0-9]*\] \([a-z-]*\) *\([0-9][0-9]*\) .*/\1=\2/p' /tmp/stress.out | tr '\n' ' ')"
    rmdir "$1/stress" 2>/dev/null || true
}

# fio_on DIR: random 4 KiB writes and sequential 128 KiB writes, 2 jobs each, verified with
# crc32c after writing; the files stay for the host's `fio --verify_only`.
fio_on() {
    mkdir -p "$1/fio"
    FIO_DIR="$1/fio" FIO_MB="$FIO_MB" /usr/bin/fio --output=/tmp/fio.out /mnt/load.fio
    rc=$?
    grep -E 'err=|WRITE:|READ:' /tmp/fio.out
    [ "$rc" = 0 ] || { tail -n 30 /tmp/fio.out; fail "fio exit status $rc"; }
    ! grep -E 'err= *[1-9]' /tmp/fio.out || fail "a fio job reported an error"
    ! grep -qi 'verify.*bad\|crc32c.*mismatch' /tmp/fio.out || fail "fio verify failed"
    data "fio_$(basename "$1")" "$(grep -E '^ *(WRITE|READ):' /tmp/fio.out | sed 's/^ *//' | tr '\n' ';')"
}

# keep_files DIR: files of random data (4 KiB .. 3 MiB), fsync'ed, and their sha256 list.
keep_files() {
    mkdir -p "$1/keep"
    cd "$1/keep" || fail "no $1/keep"
    for i in 1 2 3 4 5 6 7 8; do
        dd if=/dev/urandom of="f$i" bs=4k count=$((i * i * 12)) 2>/dev/null
        sync "f$i"
    done
    sha256sum f* > SHA256SUMS
    sync SHA256SUMS
    cd /
}

for m in /mnt /mnt2; do
    n="$(basename "$m")"
    t "$n: stress-ng $STRESSORS --verify ${SECS}s" stress_on "$m"
    t "$n: fio randwrite 4k + write 128k, verify=crc32c, ${FIO_MB} MiB per job" fio_on "$m"
    t "$n: files written, fsync'ed and listed with sha256" keep_files "$m"
done
t "both: sha256 lists read back in the guest" sh -c 'cd /mnt/keep && sha256sum -c -s SHA256SUMS && cd /mnt2/keep && sha256sum -c -s SHA256SUMS'
mark loaded
rm -rf /mnt/stress /mnt2/stress
sync; echo 3 > /proc/sys/vm/drop_caches
sleep 2
mark after
cd /
umount /mnt2
