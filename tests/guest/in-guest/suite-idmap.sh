# shellcheck shell=sh
# Idmapped mounts (FUSE_ALLOW_IDMAP, guest kernel 6.12+): run by /init after the main suite, on
# the same virtiofs mount. /idmapped is an idmapped bind mount of /mnt (helpers/idmapmount.c)
# whose idmapping shows the share's ids 100000..165535 as 0..65535: guest root creates files
# owned by 100000 on the host, guest user 1000 files owned by 101000; what the host owns as 0
# shows as 65534 there. The host checks the owners in the share afterwards (host_checks_idmap
# in run.sh), and that only creating requests carried ids.
# On an older guest kernel (6.1 has no FUSE_ALLOW_IDMAP) the suite does not run.
IM=/idmapped
IW=/mnt/work/idmap     # the test directory through the plain mount
IX=$IM/work/idmap      # the same directory through the idmapped mount

idmap_kernel_ok() {
    # major.minor of the running kernel >= 6.12
    uname -r | awk -F. '{ exit !($1 * 100 + $2 >= 612) }'
}

# owners PATH: uid:gid of PATH itself (not following symlinks)
owners() { stat -c %u:%g "$1"; }

if ! idmap_kernel_ok; then
    echo "# idmap suite not run: guest kernel $(uname -r) predates FUSE_ALLOW_IDMAP (6.12)"
else
    # The host checks the requests from here on (requests the main suite made through a
    # submount, a super block of its own, carry ids whatever FUSE_ALLOW_IDMAP says).
    mark idmap-start
    t_idmap_mount() {
        mkdir -p $IM $IW
        # Through the mount the directory must show as root's, or guest root may not create in
        # it: its host owner is the one that maps to 0.
        chown 100000:100000 $IW
        idmapmount /mnt $IM 100000 65536 ||
            fail "the kernel refused an idmapped mount of virtiofs (was FUSE_ALLOW_IDMAP agreed?)"
        grep " $IM " /proc/self/mountinfo | grep -q idmapped ||
            fail "$IM is not listed as idmapped: $(grep " $IM " /proc/self/mountinfo)"
    }
    t idmap-mount-virtiofs t_idmap_mount

    t_idmap_root_creates() {
        [ -d $IX ] || fail "no idmapped mount"
        echo "made through the idmapped mount" > $IX/root-file
        mkdir $IX/root-dir
        ln -s root-file $IX/root-symlink
        mkfifo $IX/root-fifo
        for n in root-file root-dir root-symlink root-fifo; do
            eq "$(owners $IX/$n)" 0:0 "owner of $n through $IM"
            eq "$(owners $IW/$n)" 100000:100000 "owner of $n through /mnt"
        done
        eq "$(cat $IW/root-file)" "made through the idmapped mount" "content through /mnt"
        eq "$(owners $IX)" 0:0 "owner of the test directory through $IM"
    }
    t idmap-root-creates-as-mapped-root t_idmap_root_creates

    t_idmap_views() {
        [ -d $IX ] || fail "no idmapped mount"
        echo plain > $IW/plain-root-file
        eq "$(owners $IW/plain-root-file)" 0:0 "owner through /mnt of a file made there"
        eq "$(owners $IX/plain-root-file)" 65534:65534 "owner through $IM (0 is not mapped)"
        eq "$(owners $IM/fixtures/hello.txt)" 65534:65534 "owner of a host-made file through $IM"
        touch $IW/mapped-file
        chown 100007:100008 $IW/mapped-file
        eq "$(owners $IX/mapped-file)" 7:8 "owner through $IM of a file chowned to 100007:100008"
        # chown through the idmapped mount stores the mapped ids
        touch $IX/chowned
        chown 42:43 $IX/chowned
        eq "$(owners $IW/chowned)" 100042:100043 "owner through /mnt after chown 42:43 through $IM"
    }
    t idmap-two-views-of-owners t_idmap_views

    t_idmap_user_creates() {
        [ -d $IX ] || fail "no idmapped mount"
        mkdir $IX/udir
        chown 1000:1000 $IX/udir
        eq "$(owners $IW/udir)" 101000:101000 "owner through /mnt of a dir chowned to 1000:1000"
        runas 1000 1000 sh -c "echo by-user > $IX/udir/user-file && mkdir $IX/udir/user-dir"
        eq "$(owners $IX/udir/user-file)" 1000:1000 "owner of user-file through $IM"
        eq "$(owners $IW/udir/user-file)" 101000:101000 "owner of user-file through /mnt"
        eq "$(owners $IW/udir/user-dir)" 101000:101000 "owner of user-dir through /mnt"
        # user 1000 is not the owner of the mapped-root directory: the kernel refuses
        must_fail_with "Permission denied" runas 1000 1000 touch $IX/user-not-here
    }
    t idmap-user-creates-as-mapped-user t_idmap_user_creates

    t_idmap_other_ops() {
        # Requests that create nothing carry no caller ids; they still work.
        [ -d $IX ] || fail "no idmapped mount"
        echo one > $IX/ops-file
        echo two >> $IX/ops-file
        eq "$(cat $IX/ops-file | tr '\n' ,)" "one,two," "content after append"
        mv $IX/ops-file $IX/ops-renamed
        chmod 600 $IX/ops-renamed
        eq "$(stat -c %a $IW/ops-renamed)" 600 "mode after chmod through $IM"
        ln $IX/ops-renamed $IX/ops-link
        eq "$(stat -c %h $IX/ops-renamed)" 2 "link count after a hard link"
        rm $IX/ops-renamed $IX/ops-link
        [ ! -e $IW/ops-renamed ] || fail "ops-renamed still there"
        ls -la $IX > /dev/null
    }
    t idmap-other-ops-without-ids t_idmap_other_ops

    # The idmapped mount keeps the virtiofs superblock alive: it must go before /init unmounts
    # /mnt, or the guest would never send FUSE_DESTROY.
    t_idmap_umount() {
        cd /
        if grep -q " $IM " /proc/mounts; then
            umount $IM || fail "umount $IM failed"
        fi
        ! grep -q " $IM " /proc/mounts || fail "$IM still mounted"
    }
    t idmap-umount t_idmap_umount
fi
