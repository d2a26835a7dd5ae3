# shellcheck shell=sh
# Read-only suite: the daemon runs with --readonly --xattr. Reads must work; every change must
# fail with EROFS ("Read-only file system"), and the host checks afterwards that the share is
# unchanged.
F=/mnt/fixtures
RO="Read-only file system"

t_ro_read() {
    eq "$(cat $F/hello.txt)" "hello from the host" "content of a host-made file"
}
t ro-read-file t_ro_read

t_ro_list() {
    getdents $F/bigdir > /tmp/gd
    grep -qx "names 10006" /tmp/gd || fail "$(tr '\n' ' ' < /tmp/gd)"
    grep -qx "dups 0" /tmp/gd || fail "$(tr '\n' ' ' < /tmp/gd)"
}
t ro-list-bigdir t_ro_list

t_ro_getxattr() {
    eq "$(xattr get $F/hello.txt user.from-host)" host-value "getxattr"
}
t ro-getxattr t_ro_getxattr

t_ro_statfs() {
    eq "$(stat -f -c %t /mnt)" 65735546 "f_type"
    df /mnt >/dev/null
}
t ro-statfs t_ro_statfs

t ro-create-erofs must_fail_with "$RO" touch /mnt/new-file
t ro-create-in-subdir-erofs must_fail_with "$RO" sh -c "echo x > $F/new-file"
t ro-append-erofs must_fail_with "$RO" sh -c "echo x >> $F/hello.txt"
t ro-open-write-erofs must_fail_with "$RO" dd if=/dev/zero of=$F/hello.txt bs=1 count=1 conv=notrunc
t ro-truncate-erofs must_fail_with "$RO" truncate -s 0 $F/hello.txt
t ro-mkdir-erofs must_fail_with "$RO" mkdir /mnt/new-dir
t ro-rmdir-erofs must_fail_with "$RO" rmdir $F/emptydir
t ro-unlink-erofs must_fail_with "$RO" rm -f $F/hello.txt
t ro-rename-erofs must_fail_with "$RO" mv $F/hello.txt $F/renamed.txt
t ro-symlink-erofs must_fail_with "$RO" ln -s hello.txt $F/new-link
t ro-link-erofs must_fail_with "$RO" ln $F/hello.txt $F/new-hardlink
t ro-chmod-erofs must_fail_with "$RO" chmod 0600 $F/hello.txt
t ro-chown-erofs must_fail_with "$RO" chown 1234 $F/hello.txt
t ro-utimes-erofs must_fail_with "$RO" touch -d '2001-02-03 04:05:06' $F/hello.txt
t ro-mkfifo-erofs must_fail_with "$RO" mkfifo $F/new-fifo
t ro-mknod-erofs must_fail_with "$RO" mknod $F/new-chr c 1 3
t ro-setxattr-erofs must_fail_with "$RO" xattr set $F/hello.txt user.new value
t ro-removexattr-erofs must_fail_with "$RO" xattr remove $F/hello.txt user.from-host

t_ro_unchanged() {
    eq "$(cat $F/hello.txt)" "hello from the host" "content after the refused writes"
    [ ! -e /mnt/new-file ] && [ ! -e /mnt/new-dir ] && [ ! -e $F/new-link ] || fail "something was created"
}
t ro-nothing-changed t_ro_unchanged
# The read-only boot runs the daemon with --announce-submounts: the host mount point under the share
# is a submount in the guest, with a device number of its own.
t_submount() {
    D=$F/nofiletype
    [ -e $D/MOUNT-FAILED ] && fail "the host could not mount the fixture: $(cat $D/MOUNT-FAILED)"
    a=$(stat -c %d /mnt)
    b=$(stat -c %d $D)
    [ "$a" != "$b" ] || fail "$D has the share's device number $a: not announced as a submount"
    grep -q " $D virtiofs " /proc/mounts || fail "no virtiofs submount at $D: $(grep virtiofs /proc/mounts | tr '\n' ';')"
    # Unmount it so that the final unmount of /mnt is clean.
    umount $D
}
t host-mount-point-is-a-guest-submount t_submount
