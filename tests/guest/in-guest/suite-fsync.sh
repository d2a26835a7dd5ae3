# shellcheck shell=sh
# fsync suite (tests/guest/reliability.sh): on /mnt (--cache auto), /m/always (--cache always:
# handle-less I/O) and /m/wb (--cache always --writeback) the guest writes four files:
# f-fsync is fsync'ed, f-fdatasync fdatasync'ed, f-syncfs followed by syncfs(2) of its file
# system, f-none never synced. At "#MARK fsynced" (after fsync and fdatasync, before syncfs)
# and "#MARK synced" (after syncfs) the host looks at the files' contents and the host calls
# the daemons made (strace).
t_mounts() {
    for m in always wb; do mkdir -p "/m/$m"; mount -t virtiofs "$m" "/m/$m"; done
}
t mount-always-and-writeback t_mounts

t_write_sync() {
    for d in /mnt /m/always /m/wb; do
        n="$(basename "$d")"
        for f in fsync fdatasync syncfs none; do
            dd if=/dev/urandom of="$d/f-$f" bs=4k count=8 2>/dev/null
            data "sha_${n}_$f" "$(sha256sum "$d/f-$f" | cut -d' ' -f1)"
        done
        sync "$d/f-fsync"           # fsync(2)
        sync -d "$d/f-fdatasync"    # fdatasync(2)
    done
}
t write-then-fsync-and-fdatasync t_write_sync
# the host looks at f-fsync and f-fdatasync here, before any syncfs could have written them
mark fsynced
t_syncfs() {
    for d in /mnt /m/always /m/wb; do sync -f "$d/f-syncfs"; done   # syncfs(2)
}
t syncfs t_syncfs
mark synced
cd /
for m in always wb; do umount "/m/$m"; done
