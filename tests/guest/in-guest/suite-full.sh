# shellcheck shell=sh
# Full file system suite (tests/guest/reliability.sh): /mnt is a share on a small ext4 whose
# blocks the guest fills, /mnt2 (tag "inodes") one on an ext4 with 64 inodes that the guest
# runs out of. Writes, creates, mkdir and xattrs must fail with ENOSPC, files written before
# must keep their content, the daemon must keep serving, and what the guest frees must be
# usable again. The host checks the early files again afterwards.
NOSPC="No space left on device"

t_seed() {
    for m in /mnt /mnt2; do
        mkdir -p "$m/seed"
        for i in 1 2 3; do dd if=/dev/urandom of="$m/seed/s$i" bs=4k count=$((i * 16)) 2>/dev/null; done
        (cd "$m/seed" && sha256sum s* > SHA256SUMS)
        sync "$m"/seed/*
    done
}
t_mount_inodes() { mkdir -p /mnt2; mount -t virtiofs inodes /mnt2 2>&1; }

t_fill_blocks() {
    # big writes until the device is full, then small ones for the last blocks
    if dd if=/dev/zero of=/mnt/fill bs=1M 2>/tmp/dd.err; then fail "dd of 1 MiB blocks never failed"; fi
    grep -q "$NOSPC" /tmp/dd.err || fail "dd failed with '$(cat /tmp/dd.err)'"
    if dd if=/dev/zero of=/mnt/fill2 bs=4k 2>/tmp/dd.err; then fail "dd of 4 KiB blocks never failed"; fi
    grep -q "$NOSPC" /tmp/dd.err || fail "second dd failed with '$(cat /tmp/dd.err)'"
    eq "$(stat -f -c %a /mnt)" 0 "free blocks seen by the guest"
}

t_enospc_ops() {
    must_fail_with "$NOSPC" dd if=/dev/zero of=/mnt/new-file bs=8k count=1
    must_fail_with "$NOSPC" mkdir /mnt/new-dir
    # a value too big for the inode's own space needs a block of its own
    must_fail_with "$NOSPC" xattr set /mnt/seed/s1 user.big "$(printf 'v%.0s' $(seq 1 3000))"
    must_fail_with "$NOSPC" sh -c 'cat /mnt/seed/s3 >> /mnt/seed/s2'
}

t_seed_intact() { cd "$1/seed" && sha256sum -c -s SHA256SUMS || fail "a seed file changed"; }

t_free_and_reuse() {
    rm /mnt/fill /mnt/fill2 /mnt/new-file 2>/dev/null || rm /mnt/fill /mnt/fill2
    sync
    n=0
    while [ "$(stat -f -c %a /mnt)" -lt 1000 ]; do
        n=$((n + 1)); [ $n -gt 50 ] && fail "free blocks stay at $(stat -f -c %a /mnt) after rm"; sleep 0.2
    done
    dd if=/dev/urandom of=/mnt/after bs=64k count=32 2>/dev/null
    sync /mnt/after
    sha256sum /mnt/after | cut -d' ' -f1 > /tmp/after.sum
    mkdir /mnt/new-dir
    xattr set /mnt/seed/s1 user.big "$(printf 'v%.0s' $(seq 1 3000))"
    eq "$(xattr get /mnt/seed/s1 user.big | wc -c)" 3001 "xattr value length (+ newline)"
    data after_sha256 "$(cat /tmp/after.sum)"
}

t_fill_inodes() {
    mkdir /mnt2/many
    : > /mnt2/app.txt
    i=0
    while touch "/mnt2/many/f$i" 2>/tmp/touch.err; do
        i=$((i + 1)); [ $i -gt 5000 ] && fail "5000 files made on a 64-inode file system"
    done
    grep -q "$NOSPC" /tmp/touch.err || fail "create failed with '$(cat /tmp/touch.err)'"
    echo "created $i files before ENOSPC"
    eq "$(stat -f -c %d /mnt2)" 0 "free inodes seen by the guest"
    must_fail_with "$NOSPC" mkdir /mnt2/d
    must_fail_with "$NOSPC" ln -s target /mnt2/l
    must_fail_with "$NOSPC" mkfifo /mnt2/p
    # writing into an existing file needs no inode
    echo "still writable" >> /mnt2/app.txt
    eq "$(cat /mnt2/app.txt)" "still writable" "append to an existing file"
    data inodes_created "$i"
}

t_inodes_reuse() {
    rm /mnt2/many/f1 /mnt2/many/f2 /mnt2/many/f3
    echo new > /mnt2/many/new
    mkdir /mnt2/d
    ln -s target /mnt2/l
    eq "$(cat /mnt2/many/new)" new "file made after freeing inodes"
}

t mount-inode-share t_mount_inodes
t seed-files-before-filling t_seed
t blocks-fill-to-enospc t_fill_blocks
t blocks-full-write-mkdir-xattr-append-enospc t_enospc_ops
t blocks-seed-files-intact t_seed_intact /mnt
t blocks-freed-space-usable-again t_free_and_reuse
t inodes-fill-create-mkdir-symlink-mkfifo-enospc t_fill_inodes
t inodes-seed-files-intact t_seed_intact /mnt2
t inodes-freed-usable-again t_inodes_reuse
cd /
umount /mnt2
