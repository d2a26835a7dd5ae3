# shellcheck shell=sh
# Main suite: runs against a daemon started with --xattr (cache auto) on a share prepared by
# the host (see prepare_share in run.sh): /mnt/fixtures holds what the host made before boot.
# Everything the guest makes goes under /mnt/work; the host inspects some of it after the run.
F=/mnt/fixtures
W=/mnt/work
mkdir -p $W
cd $W || echo "# cannot cd to $W"

t_fixture_read() {
    eq "$(cat $F/hello.txt)" "hello from the host" "content of a host-made file"
    eq "$(stat -c %s $F/hello.txt)" 20 "size"
}
t read-host-file t_fixture_read

t_create() {
    echo "first line" > created.txt
    [ -f created.txt ] || fail "created.txt missing after create"
    eq "$(cat created.txt)" "first line" "content"
    eq "$(stat -c %s created.txt)" 11 "size"
    eq "$(stat -c %a created.txt)" 644 "mode (umask 022)"
}
t create-write-read t_create

t_append() {
    printf 'one\n' > append.txt
    printf 'two\n' >> append.txt
    printf 'three\n' >> append.txt
    eq "$(cat append.txt | tr '\n' ,)" "one,two,three," "content after two appends"
    eq "$(stat -c %s append.txt)" 14 "size"
}
t append t_append

t_overwrite_middle() {
    printf 'AAAAAAAAAA' > middle.txt
    printf 'bb' | dd of=middle.txt bs=1 seek=4 conv=notrunc 2>/dev/null
    eq "$(cat middle.txt)" "AAAAbbAAAA" "content after writing at offset 4"
}
t write-at-offset t_overwrite_middle

t_truncate_shrink() {
    printf 'hello world\n' > trunc.txt
    truncate -s 5 trunc.txt
    eq "$(stat -c %s trunc.txt)" 5 "size after truncate -s 5"
    eq "$(cat trunc.txt)" "hello" "content after truncate"
    : > trunc.txt
    eq "$(stat -c %s trunc.txt)" 0 "size after O_TRUNC"
}
t truncate-shrink t_truncate_shrink

t_truncate_extend() {
    printf 'abc' > sparse.bin
    truncate -s 1048576 sparse.bin
    eq "$(stat -c %s sparse.bin)" 1048576 "size after truncate -s 1M"
    eq "$(head -c 3 sparse.bin)" "abc" "head kept"
    eq "$(tail -c +4 sparse.bin | tr -d '\000' | wc -c)" 0 "non-zero bytes in the extended part"
}
t truncate-extend-zeros t_truncate_extend

t_mkdir_rmdir() {
    mkdir d1
    [ -d d1 ] || fail "d1 not a directory"
    eq "$(stat -c %h d1)" 2 "link count of a new dir"
    mkdir d1/sub
    eq "$(stat -c %h d1)" 3 "link count after mkdir of a subdir"
    touch d1/sub/f
    must_fail_with "not empty" rmdir d1/sub
    rm d1/sub/f
    rmdir d1/sub d1
    [ ! -e d1 ] || fail "d1 still there after rmdir"
}
t mkdir-rmdir t_mkdir_rmdir

t_rename_simple() {
    echo payload > ren-a
    mv ren-a ren-b
    [ ! -e ren-a ] || fail "old name still exists"
    eq "$(cat ren-b)" payload "content under new name"
}
t rename t_rename_simple

t_rename_over() {
    echo source > over-src
    echo target > over-dst
    ino=$(stat -c %i over-src)
    mv -f over-src over-dst
    [ ! -e over-src ] || fail "source name still exists"
    eq "$(cat over-dst)" source "content of the replaced target"
    eq "$(stat -c %i over-dst)" "$ino" "inode of the target is the source's"
    eq "$(ls | grep -c '^over-')" 1 "entries named over-*"
}
t rename-over-existing t_rename_over

t_rename_across() {
    mkdir -p from-dir to-dir
    echo moved > from-dir/file
    mv from-dir/file to-dir/file2
    [ ! -e from-dir/file ] || fail "still in the source dir"
    eq "$(cat to-dir/file2)" moved "content in the target dir"
    eq "$(ls from-dir | wc -l)" 0 "entries left in the source dir"
}
t rename-across-dirs t_rename_across

t_rename_dir() {
    mkdir -p rdir/inner
    echo x > rdir/inner/f
    mkdir -p rdir-parent
    mv rdir rdir-parent/renamed
    eq "$(cat rdir-parent/renamed/inner/f)" x "file inside the moved dir"
    [ ! -e rdir ] || fail "old dir still there"
}
t rename-directory t_rename_dir

t_hardlink() {
    echo linked > hl-a
    ln hl-a hl-b
    eq "$(stat -c %h hl-a)" 2 "link count of the original"
    eq "$(stat -c %h hl-b)" 2 "link count of the new link"
    eq "$(stat -c %i hl-b)" "$(stat -c %i hl-a)" "inode numbers"
    echo more >> hl-b
    eq "$(cat hl-a | tr '\n' ,)" "linked,more," "write through one name seen through the other"
    # keep a second pair for the host to check
    echo kept > hl-kept-a
    ln hl-kept-a hl-kept-b
    rm hl-a
    eq "$(stat -c %h hl-b)" 1 "link count after unlinking the other name"
}
t hardlink-count-2 t_hardlink

t_symlink() {
    echo target-content > sl-target
    ln -s sl-target sl-link
    eq "$(readlink sl-link)" sl-target "readlink"
    eq "$(stat -c %F sl-link)" "symbolic link" "file type"
    eq "$(cat sl-link)" target-content "read through the link"
    ln -s /does/not/exist/anywhere sl-dangling
    eq "$(readlink sl-dangling)" /does/not/exist/anywhere "readlink of a dangling link"
    [ ! -e sl-dangling ] || fail "dangling link resolves"
}
t symlink-readlink t_symlink

t_chmod() {
    echo x > mode.txt
    chmod 0640 mode.txt
    eq "$(stat -c %a mode.txt)" 640 "mode after chmod 0640"
    chmod 0755 mode.txt
    eq "$(stat -c %a mode.txt)" 755 "mode after chmod 0755"
    chmod 4711 mode.txt
    eq "$(stat -c %a mode.txt)" 4711 "mode after chmod 4711 (setuid)"
    chmod 0600 mode.txt
}
t chmod t_chmod

t_chown() {
    echo x > owned.txt
    chown 1234:5678 owned.txt
    eq "$(stat -c %u:%g owned.txt)" 1234:5678 "owner after chown"
    chgrp 4321 owned.txt
    eq "$(stat -c %u:%g owned.txt)" 1234:4321 "owner after chgrp"
    chown 1234:5678 owned.txt
}
t chown-as-root t_chown

t_user_create() {
    mkdir -m 0777 userdir
    runas 1000 1000 sh -c 'echo by-user > /mnt/work/userdir/user-file && mkdir /mnt/work/userdir/user-dir'
    eq "$(stat -c %u:%g userdir/user-file)" 1000:1000 "owner of a file a user created"
    eq "$(stat -c %u:%g userdir/user-dir)" 1000:1000 "owner of a dir a user created"
}
t create-as-user-owner t_user_create

t_user_denied() {
    mkdir -m 0755 rootdir
    echo secret > rootdir/secret
    chmod 0600 rootdir/secret
    must_fail_with "Permission denied" runas 1000 1000 touch /mnt/work/rootdir/new
    must_fail_with "Permission denied" runas 1000 1000 cat /mnt/work/rootdir/secret
    [ ! -e rootdir/new ] || fail "file created despite EACCES"
}
t permission-denied-as-user t_user_denied

t_utimes() {
    echo x > times.txt
    touch -m -d '2001-02-03 04:05:06' times.txt
    eq "$(stat -c %Y times.txt)" 981173106 "mtime after touch -m -d"
    touch -a -d '1999-12-31 23:59:58' times.txt
    eq "$(stat -c %X times.txt)" 946684798 "atime after touch -a -d"
    eq "$(stat -c %Y times.txt)" 981173106 "mtime unchanged by touch -a"
}
t utimes-touch-d t_utimes

t_mkfifo() {
    mkfifo fifo
    eq "$(stat -c %F fifo)" "fifo" "file type"
    (echo through-the-fifo > fifo) &
    eq "$(cat fifo)" through-the-fifo "data through the fifo"
    wait
}
t mkfifo t_mkfifo

t_mknod() {
    mknod chr-zero c 1 5
    eq "$(stat -c %F chr-zero)" "character special file" "file type"
    eq "$(stat -c %t:%T chr-zero)" 1:5 "major:minor (hex)"
    eq "$(head -c 8 chr-zero | od -An -tx1 | tr -d ' ')" 0000000000000000 "read from the device node"
    mknod chr-big c 240 300
    eq "$(stat -c %t:%T chr-big)" f0:12c "major:minor 240:300 (hex)"
}
t mknod-char-device t_mknod

t_xattr() {
    echo x > xa.txt
    xattr set xa.txt user.greeting hello
    eq "$(xattr get xa.txt user.greeting)" hello "getxattr"
    xattr set xa.txt user.greeting replaced replace
    eq "$(xattr get xa.txt user.greeting)" replaced "getxattr after replace"
    xattr set xa.txt user.kept kept-value
}
t xattr-set-get t_xattr

t_xattr_list() {
    xattr list xa.txt | sort > /tmp/xl
    grep -qx user.greeting /tmp/xl || fail "user.greeting not listed: $(cat /tmp/xl)"
    grep -qx user.kept /tmp/xl || fail "user.kept not listed: $(cat /tmp/xl)"
}
t xattr-list t_xattr_list

t_xattr_remove() {
    xattr remove xa.txt user.greeting
    rc=0; xattr get xa.txt user.greeting 2>/dev/null || rc=$?
    eq "$rc" 3 "getxattr of a removed attribute (3 = ENODATA)"
    rc=0; xattr set xa.txt user.kept again create 2>/dev/null || rc=$?
    eq "$rc" 7 "XATTR_CREATE on an existing attribute (7 = EEXIST)"
    xattr list xa.txt | grep -q greeting && fail "removed attribute still listed"
    true
}
t xattr-remove-errors t_xattr_remove

t_xattr_host() {
    eq "$(xattr get $F/hello.txt user.from-host)" host-value "xattr set on the host"
}
t xattr-read-host-set t_xattr_host

t unlink-while-open unlinkopen $W/unlinked.bin

# xfstests generic/035: fstat of an open file, and of an open directory, another was renamed
# over (with --cache always the directory answered ESTALE).
mkdir -p $W/renameover
t rename-over-open-file-and-dir renameover $W/renameover

t_big() {
    dd if=/dev/urandom of=big.bin bs=1M count=64 conv=fsync 2>/dev/null
    eq "$(stat -c %s big.bin)" 67108864 "size"
    sum1=$(sha256sum big.bin | cut -d' ' -f1)
    data big_sha256 "$sum1"
    # read it back from the daemon, not from the page cache
    sync; echo 3 > /proc/sys/vm/drop_caches
    sum2=$(sha256sum big.bin | cut -d' ' -f1)
    eq "$sum2" "$sum1" "sha256 after dropping caches"
}
t big-file-64MiB-write-read t_big

t_bigdir_counts() {
    getdents $F/bigdir > /tmp/gd
    cat /tmp/gd
    for kv in "reg 10000" "dir 3" "lnk 1" "fifo 1" "sock 1" "chr 1" "blk 1" "unknown 0" \
              "other 0" "names 10006" "dups 0" "zero_ino 0"; do
        grep -qx "$kv" /tmp/gd || fail "expected '$kv'"
    done
}
t bigdir-10000-counts-no-dups t_bigdir_counts

t_bigdir_names() {
    getdents -b 4096 -l $F/bigdir | sort | md5sum | cut -d' ' -f1 > /tmp/md5
    eq "$(cat /tmp/md5)" "$(cat $F/bigdir.expected.md5)" "md5 of sorted 'type name' lines"
}
t bigdir-names-and-dtypes t_bigdir_names

t_bigdir_small_buf() {
    getdents -b 512 $F/bigdir > /tmp/gd
    grep -qx "names 10006" /tmp/gd || fail "listing with a 512-byte buffer: $(tr '\n' ' ' < /tmp/gd)"
    grep -qx "dups 0" /tmp/gd || fail "listing with a 512-byte buffer: $(tr '\n' ' ' < /tmp/gd)"
}
t bigdir-small-getdents-buffer t_bigdir_small_buf

t_nofiletype_dtypes() {
    D=$F/nofiletype
    [ -e $D/MOUNT-FAILED ] && fail "the host could not mount an ext4 without filetype: $(cat $D/MOUNT-FAILED)"
    getdents $D > /tmp/gd
    cat /tmp/gd
    # ., .., lost+found and dir are directories; the host reported DT_UNKNOWN for all of them.
    for kv in "reg 1" "dir 4" "lnk 1" "fifo 1" "sock 1" "chr 1" "blk 1" "unknown 0" "dups 0"; do
        grep -qx "$kv" /tmp/gd || fail "expected '$kv'"
    done
}
t dtype-on-host-fs-without-filetype t_nofiletype_dtypes


t_stat_types() {
    eq "$(stat -c %F $F/bigdir/d)" "directory" "d"
    eq "$(stat -c %F $F/bigdir/l)" "symbolic link" "l"
    eq "$(stat -c %F $F/bigdir/p)" "fifo" "p"
    eq "$(stat -c %F $F/bigdir/s)" "socket" "s"
    eq "$(stat -c %F $F/bigdir/c)" "character special file" "c"
    eq "$(stat -c %F $F/bigdir/b)" "block special file" "b"
    eq "$(stat -c %F $F/bigdir/f00000)" "regular empty file" "f00000"
}
t stat-file-types t_stat_types

t_statfs() {
    eq "$(stat -f -c %t /mnt)" 65735546 "f_type (FUSE_SUPER_MAGIC)"
    data statfs "$(stat -f -c '%S %b %c' /mnt)"
    df /mnt >/dev/null || fail "df /mnt failed"
    [ "$(stat -f -c %b /mnt)" -gt 0 ] || fail "zero total blocks"
}
t statfs t_statfs

t_parallel() {
    # Two writers and two readers at once, pinned to different CPUs so that a kernel with
    # multi-queue virtiofs (6.11+) sends their requests down different request queues.
    mark parallel-start
    taskset 1 dd if=/dev/urandom of=par-a.bin bs=256k count=64 conv=fsync 2>/tmp/dd-a &
    pa=$!
    taskset 2 dd if=/dev/urandom of=par-b.bin bs=256k count=64 conv=fsync 2>/tmp/dd-b &
    pb=$!
    taskset 1 sh -c "sha256sum < $F/read-a.bin > /tmp/ra" &
    ra=$!
    taskset 2 sh -c "sha256sum < $F/read-b.bin > /tmp/rb" &
    rb=$!
    st=0
    wait $pa || { st=1; echo "writer a failed: $(cat /tmp/dd-a)"; }
    wait $pb || { st=1; echo "writer b failed: $(cat /tmp/dd-b)"; }
    wait $ra || { st=1; echo "reader a failed"; }
    wait $rb || { st=1; echo "reader b failed"; }
    mark parallel-end
    [ $st -eq 0 ] || fail "a parallel job failed"
    eq "$(cut -d' ' -f1 /tmp/ra)" "$(cat $F/read-a.bin.sha256)" "reader a sha256"
    eq "$(cut -d' ' -f1 /tmp/rb)" "$(cat $F/read-b.bin.sha256)" "reader b sha256"
    eq "$(stat -c %s par-a.bin)" 16777216 "writer a size"
    eq "$(stat -c %s par-b.bin)" 16777216 "writer b size"
    data par_a_sha256 "$(sha256sum par-a.bin | cut -d' ' -f1)"
    data par_b_sha256 "$(sha256sum par-b.bin | cut -d' ' -f1)"
}
t parallel-writers-readers-2-cpus t_parallel

# A host-made tree of 30,000 files in 1,000 directories (prepare_tree in run.sh). The daemon
# gives every directory entry its real d_type, so GNU find (fts) never has to stat a
# non-directory. The stat-family calls of GNU find under strace (-y: fds shown as paths) are
# classified by the file type they returned and by the name they asked for; regular files and
# symlinks of the tree must get none. GNU find stats each directory 3 times (lstat before
# entering, fstat of the opened fd, lstat again when leaving), so directories may get up to
# 3 per directory plus a few.
TREE=$F/tree30k
TREE_DIRS=1101            # the tree itself, 100 dNN, 1,000 dNN/sN
# find_stats KEY FIND_ARGS...: runs /usr/bin/find $TREE FIND_ARGS under strace, output to
# /tmp/list; prints a summary and hands it to the host ("#DATA find_stats_KEY ...", which run.sh
# prints); sets ST_TOTAL ST_OUTSIDE ST_DIR ST_REG ST_LNK ST_OTHER ST_BYNAME
find_stats() {
    _key="$1"; shift
    _t0=$(cut -d' ' -f1 /proc/uptime)
    /usr/bin/strace -f --seccomp-bpf -qq -y -s 256 -o /tmp/trace -e trace=%stat,%lstat,%fstat \
        /usr/bin/find $TREE "$@" > /tmp/list 2>/tmp/find.err \
        || fail "strace find $TREE $* failed: $(head -n 5 /tmp/find.err)"
    awk -v tree="$TREE" '
        / \+\+\+ / || / --- / { next }
        {
            total++
            sc = $0; sub(/^[0-9]+ +/, "", sc); sub(/\(.*/, "", sc); calls[sc]++
            name = ""
            if (match($0, /"[^"]*"/)) name = substr($0, RSTART + 1, RLENGTH - 2)
            sub(/.*\//, "", name)
            if (name ~ /^f[0-9][0-9]$/ || name == "ln") byname++
            if (index($0, tree) == 0) { outside++; next }
            if ($0 ~ /mode=S_IFDIR/) dir++
            else if ($0 ~ /mode=S_IFREG/) reg++
            else if ($0 ~ /mode=S_IFLNK/) lnk++
            else other++
        }
        END {
            s = ""; for (c in calls) s = s " " c "=" calls[c]
            printf "%d %d %d %d %d %d %d%s\n", total, outside, dir, reg, lnk, other, byname, s
        }' /tmp/trace > /tmp/counts
    _secs=$(awk -v a="$_t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN { printf "%.1f", b - a }')
    read ST_TOTAL ST_OUTSIDE ST_DIR ST_REG ST_LNK ST_OTHER ST_BYNAME ST_CALLS < /tmp/counts
    echo "stat-family calls: $ST_TOTAL ($ST_CALLS); outside the tree (startup): $ST_OUTSIDE;" \
         "in the tree: directories $ST_DIR (for $TREE_DIRS dirs), regular files $ST_REG," \
         "symlinks $ST_LNK, failed/other $ST_OTHER; naming a file or symlink: $ST_BYNAME;" \
         "find under strace took ${_secs}s" \
         > /tmp/find-stats
    cat /tmp/find-stats
    data "find_stats_$_key" "$(cat /tmp/find-stats)"
}
check_no_file_stats() {
    [ "$ST_DIR" -ge "$TREE_DIRS" ] || fail "only $ST_DIR stat calls on directories: the trace did not see find's traversal ($(cat /tmp/find-stats))"
    eq "$ST_REG" 0 "stat calls returning a regular file"
    eq "$ST_LNK" 0 "stat calls returning a symlink"
    eq "$ST_OTHER" 0 "failed or unclassified stat calls on the tree"
    eq "$ST_BYNAME" 0 "stat calls naming a file (f00..f29) or symlink (ln)"
    [ "$ST_DIR" -le $((3 * TREE_DIRS + 10)) ] \
        || fail "$ST_DIR stat calls on $TREE_DIRS directories (more than 3 per directory)"
}

t_find_30k() {
    [ -d $TREE ] || fail "$TREE missing"
    find_stats all
    eq "$(wc -l < /tmp/list)" 31111 "paths printed (1 + 100 + 1,000 dirs, 30,000 files, 10 symlinks)"
    eq "$(grep -c '/d[0-9][0-9]/s[0-9]/f[0-9][0-9]$' /tmp/list)" 30000 "file paths printed"
    eq "$(sort -u /tmp/list | wc -l)" 31111 "distinct paths printed"
    check_no_file_stats
}
t find-30k-no-stat-of-files t_find_30k

t_find_30k_type_f() {
    find_stats type_f -type f
    eq "$(wc -l < /tmp/list)" 30000 "find -type f | wc -l"
    check_no_file_stats
}
t find-30k-type-f-no-stat t_find_30k_type_f

# Reading the 30k tree twice with tar: the second (warm) read is served from the guest's caches
# as far as the cache mode allows. The host counts the requests the daemon received between the
# warm-start and warm-end marks (host_checks_main in run.sh): with --cache always there must be
# no OPEN, FLUSH, RELEASE, OPENDIR or RELEASEDIR at all.
# Other cache modes send a few requests per file on every read, too slow for the whole tree
# under TCG: they read the first tenth of it (d00-d09, 3,000 files). run.sh passes the daemon's
# cache mode on the kernel command line (guest_cache=).
uptime_s() { cut -d' ' -f1 /proc/uptime; }
t_warm_reread() {
    [ -d $TREE ] || fail "$TREE missing"
    if grep -q 'guest_cache=always' /proc/cmdline; then
        set -- . ; _min=50000000; _what="whole tree"
    else
        set -- ./d00 ./d01 ./d02 ./d03 ./d04 ./d05 ./d06 ./d07 ./d08 ./d09
        _min=5000000; _what="d00-d09"
    fi
    _t0=$(uptime_s)
    cold=$(tar cf - -C $TREE "$@" | wc -c)
    _t1=$(uptime_s)
    mark warm-start
    _t2=$(uptime_s)
    warm=$(tar cf - -C $TREE "$@" | wc -c)
    _t3=$(uptime_s)
    mark warm-end
    eq "$warm" "$cold" "bytes of the warm tar"
    [ "$cold" -gt $_min ] || fail "cold tar only $cold bytes"
    data tar_30k "$(awk -v a="$_t0" -v b="$_t1" -v c="$_t2" -v d="$_t3" -v n="$cold" -v w="$_what" \
        'BEGIN { printf "%s: cold %.2fs, warm %.2fs, %d bytes", w, b - a, d - c, n }')"
}
t tar-30k-warm-reread t_warm_reread

# A warm walk of the 30k tree after the guest's entries expired (--cache=auto: 1 s). Each
# READDIRPLUS must refresh a page of entries: the guest must not look each one up on its own
# (the host counts the requests between the marks: host_checks_main in run.sh).
t_find_after_timeout() {
    [ -d $TREE ] || fail "$TREE missing"
    find $TREE > /dev/null
    sleep 2
    mark findwarm-start
    n=$(find $TREE | wc -l)
    mark findwarm-end
    eq "$n" 31111 "paths printed"
}
t find-30k-after-the-timeout t_find_after_timeout

t_readonly_file() {
    # The guest kernel checks permissions (default_permissions); the daemon opens as itself.
    printf 'keep\n' > ro-file.txt
    chown 1000:1000 ro-file.txt
    chmod 0444 ro-file.txt
    must_fail_with "Permission denied" runas 1000 1000 sh -c 'echo changed > /mnt/work/ro-file.txt'
    must_fail_with "Permission denied" runas 1000 1000 sh -c 'echo more >> /mnt/work/ro-file.txt'
    printf 'root\n' > root-file.txt
    must_fail_with "Permission denied" runas 1000 1000 sh -c 'echo x > /mnt/work/root-file.txt'
    eq "$(cat ro-file.txt)" keep "content of the 0444 file"
    eq "$(cat root-file.txt)" root "content of the root-owned 0644 file"
    runas 1000 1000 cat /mnt/work/ro-file.txt > /dev/null || fail "the owner cannot read 0444"
}
t write-to-read-only-file-refused t_readonly_file

t_o_trunc_existing() {
    printf 'long old content\n' > otrunc.txt
    cat otrunc.txt > /dev/null
    printf 'new\n' > otrunc.txt
    eq "$(cat otrunc.txt)" new "content after a truncating open"
    eq "$(stat -c %s otrunc.txt)" 4 "size after a truncating open"
    data otrunc_size "$(stat -c %s otrunc.txt)"
}
t o-trunc-of-a-cached-file t_o_trunc_existing

t_host_deleted() {
    # The host deletes fixtures/host-deletes.txt when it sees the mark (run.sh).
    eq "$(stat -c %s $F/host-deletes.txt)" 20 "size before the host deletes it"
    mark host-delete
    sleep 1
    if cat $F/host-deletes.txt > /tmp/hd.out 2>/tmp/hd.err; then
        fail "read of a file the host deleted succeeded: '$(cat /tmp/hd.out)'"
    fi
    echo "error: $(cat /tmp/hd.err)"
}
t read-of-file-deleted-on-host-fails t_host_deleted

t_rm_tree() {
    mkdir -p tree
    for i in $(seq 1 20); do
        mkdir tree/d$i
        for j in $(seq 1 10); do echo $j > tree/d$i/f$j; done
    done
    eq "$(find tree -type f | wc -l)" 200 "files created"
    rm -rf tree
    [ ! -e tree ] || fail "tree still there after rm -rf"
}
t rm-rf-tree-200-files t_rm_tree

t_leave_for_host() {
    # Files the host checks after the run (see host_checks_main in run.sh).
    printf 'line1\nline2\n' > host-append.txt
    printf 'line3\n' >> host-append.txt
    ln -s sl-target host-symlink
    mkfifo host-fifo
    sync
}
t leave-files-for-host t_leave_for_host
