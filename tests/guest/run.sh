#!/usr/bin/env bash
# Guest-level tests: boots a Linux guest under QEMU with a vhost-user-fs-pci device served by
# target/release/virtiofsd, runs test scripts inside the guest, checks the share on the host
# afterwards, and prints one "ok N name" / "not ok N name" line per test and a last line
# "N passed, N failed". Exits non-zero when any test failed.
#
# Usage: tests/guest/run.sh [options]
#   --kernel 6.12|6.1|all   guest kernel(s) (default 6.12; 6.1 is an older FUSE client that
#                           loads fuse/virtiofs as modules and uses one request queue)
#   --suite LIST            which boots, comma-separated (default "all"):
#                             main        the main suite, daemon --xattr --cache auto
#                             readonly    the read-only suite, daemon --readonly --xattr
#                             cache-never the main suite, daemon --xattr --cache never
#                                         --thread-pool-size 4
#                             writeback   the main suite, daemon --xattr --cache always --writeback
#                             xattr       the xattr suite, daemon --posix-acl --security-label=auto
#                                         --killpriv-v2 --xattrmap (ACLs passed, user.* prefixed)
#                             escape      escape attempts from the guest against a canary
#                                         outside the share, daemon --xattr
#                             always      the main suite, daemon --xattr --cache always
#                                         --posix-lock=off --flock=off (no-open mode)
#                             locks       the locks suite (host, guest and its processes lock
#                                         one another's files), daemon --cache auto
#                             locks-always  the locks suite, daemon --cache always
#                             locks-never the locks suite, daemon --cache never, with SQLite
#                                         writers in the host and the guest on one database
#                             locks-guests two guests at once, a daemon each (--cache never)
#                                         on one share: each refused the other's locks, waits
#                                         for them, SQLite writers in both and the host
#                             noshare     QEMU without share=on (-m 256M, no memory backend):
#                                         the daemon must say guest memory is not shared
#                             all = main,readonly,xattr,escape,always,locks,locks-always,
#                             locks-never,locks-guests,noshare; full = all twelve
#   --timeout SECONDS       kill a guest that has not powered off after this long (default 300)
#   --accel auto|tcg|kvm    auto (default) uses KVM only if a short probe boot proves it works;
#                           kvm uses it without a probe
#   --daemon PATH           test this binary instead of building target/release/virtiofsd
#   --no-build              do not run cargo build (use the existing target/release/virtiofsd)
#   --keep                  keep the work dir (shares, sockets, initramfs) for inspection
#   -v, --verbose           also print the diagnostics of passing tests
# Logs of every boot (console, daemon, QEMU) are kept in target/guest-tests/.
# Needs root (the daemon must be able to chown and mknod), and tests/guest/install.sh's packages
# and kernels; it runs install.sh itself when something is missing.
set -uo pipefail

# shellcheck source=tests/lib/common.sh
. "$(dirname "$0")/../lib/common.sh"
OUT="$ROOT/target/guest-tests"

KERNELS="6.12"
SUITES="main readonly xattr escape always locks locks-always locks-never locks-guests noshare"
TIMEOUT=300
ACCEL=auto
while [ $# -gt 0 ]; do
    case "$1" in
        --kernel) KERNELS="$2"; shift 2 ;;
        --kernel=*) KERNELS="${1#*=}"; shift ;;
        --suite) SUITES="$2"; shift 2 ;;
        --suite=*) SUITES="${1#*=}"; shift ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        --timeout=*) TIMEOUT="${1#*=}"; shift ;;
        --accel) ACCEL="$2"; shift 2 ;;
        --accel=*) ACCEL="${1#*=}"; shift ;;
        *) common_option "$@" || bad_usage "unknown option $1"; shift "$TAKEN" ;;
    esac
done
[ "$KERNELS" = all ] && KERNELS="6.12 6.1"
SUITES="${SUITES//,/ }"
SUITES="${SUITES//full/main readonly cache-never writeback xattr escape always locks locks-always locks-never locks-guests noshare}"
SUITES="${SUITES//all/main readonly xattr escape always locks locks-always locks-never locks-guests noshare}"
for k in $KERNELS; do
    case "$k" in 6.12|6.1) ;; *) bad_usage "--kernel must be 6.12, 6.1 or all" ;; esac
done
case "$ACCEL" in auto|tcg|kvm) ;; *) bad_usage "--accel takes auto, tcg or kvm" ;; esac
for s in $SUITES; do
    case "$s" in
        main|readonly|cache-never|writeback|xattr|escape|always|locks|locks-always|locks-never|locks-guests|noshare) ;;
        *) bad_usage "--suite takes main, readonly, cache-never, writeback, xattr, escape, always, locks, locks-always, locks-never, locks-guests, noshare, all or full" ;;
    esac
done
need_root "the daemon has to chown and mknod for the guest"

report_start "guest tests" "$OUT"
work_dir virtiofsd-guest
mkdir -p "$OUT"

# --- prerequisites -----------------------------------------------------------------------------
# GNU find and strace go into the guest (/usr/bin/find, /usr/bin/strace; busybox's find stays
# the one on PATH).
ensure_kit "$OUT/install.log" "$KERNELS" /usr/bin/find /usr/bin/strace /usr/bin/sqlite3
prepare_daemon "$OUT/build.log"

# Static helpers for the guest (and getdents for the host).
build_helpers "$WORK/helpers"

# build_initramfs KERNEL OUTFILE: the kit's initramfs for KERNEL, with GNU find, strace and
# sqlite3.
build_initramfs() {
    kit_initramfs "$2" "$1" "$WORK/helpers" /usr/bin/find /usr/bin/strace /usr/bin/sqlite3
}

# --- accelerator -------------------------------------------------------------------------------
first_kernel="${KERNELS%% *}"
build_initramfs "$first_kernel" "$WORK/initramfs-$first_kernel.cpio"
# auto: KVM if a probe boot reaches userspace within 15 s (tests/lib/accel.sh)
choose_accel "$ACCEL" qemu-system-x86_64 "$CACHE/kernel-$first_kernel/vmlinuz" \
    "$WORK/initramfs-$first_kernel.cpio" guest_suite=probe '#PROBE-OK' "$WORK/probe.log"
echo "# accelerator: ${ACCEL_ARGS[*]}${ACCEL_NOTE:+ ($ACCEL_NOTE)}"

# --- the share ---------------------------------------------------------------------------------
# prepare_share DIR: the fixtures the guest suites expect under /mnt/fixtures.
prepare_share() {
    local s="$1"
    mkdir -p "$s/fixtures/emptydir"
    printf 'hello from the host\n' > "$s/fixtures/hello.txt"
    printf 'the host deletes me\n' > "$s/fixtures/host-deletes.txt"
    python3 - "$s/fixtures" <<'PY'
import hashlib, os, socket, sys
f = sys.argv[1]
os.setxattr(os.path.join(f, "hello.txt"), "user.from-host", b"host-value")
# Two 16 MiB files for the parallel readers, with their sha256 beside them.
for name, seed in (("read-a.bin", b"a"), ("read-b.bin", b"b")):
    block = hashlib.sha256(seed).digest() * 2048          # 64 KiB pattern
    h = hashlib.sha256()
    with open(os.path.join(f, name), "wb") as out:
        for i in range(256):
            chunk = i.to_bytes(4, "little") + block[4:]
            out.write(chunk)
            h.update(chunk)
    with open(os.path.join(f, name + ".sha256"), "w") as out:
        out.write(h.hexdigest() + "\n")
# A directory with 10,000 regular files and one of every other kind.
d = os.path.join(f, "bigdir")
os.mkdir(d)
lines = []
for i in range(10000):
    n = "f%05d" % i
    os.close(os.open(os.path.join(d, n), os.O_CREAT | os.O_WRONLY, 0o644))
    lines.append("reg " + n)
os.mkdir(os.path.join(d, "d")); lines.append("dir d")
os.symlink("f00000", os.path.join(d, "l")); lines.append("lnk l")
os.mkfifo(os.path.join(d, "p")); lines.append("fifo p")
sk = socket.socket(socket.AF_UNIX); sk.bind(os.path.join(d, "s")); sk.close(); lines.append("sock s")
os.mknod(os.path.join(d, "c"), 0o644 | 0o020000, os.makedev(1, 3)); lines.append("chr c")
os.mknod(os.path.join(d, "b"), 0o644 | 0o060000, os.makedev(7, 200)); lines.append("blk b")
text = "".join(l + "\n" for l in sorted(lines))
with open(os.path.join(f, "bigdir.expected.md5"), "w") as out:
    out.write(hashlib.md5(text.encode()).hexdigest() + "\n")
PY
}

# prepare_nofiletype DIR: mounts at DIR a loop-mounted ext4 made without the `filetype`
# feature, so the host's getdents64 reports DT_UNKNOWN for every entry, with one entry of every
# kind. The guest must still see each entry's real type (the daemon fills it in). On failure
# DIR holds only a file named MOUNT-FAILED, which makes the guest test fail with the reason.
NOFT_MOUNTS=()
prepare_nofiletype() {
    local d="$1" img="$1.img" why
    mkdir -p "$d"
    # No lazy inode table initialisation and no atime updates: nothing may write to the image
    # in the background while a boot runs (the read-only boot compares the share's mtimes).
    if ! why=$(truncate -s 16M "$img" 2>&1 \
               && mkfs.ext4 -q -F -O ^filetype -E lazy_itable_init=0,lazy_journal_init=0 "$img" 2>&1 \
               && mount -o loop,noatime "$img" "$d" 2>&1); then
        printf '%s\n' "$why" > "$d/MOUNT-FAILED"
        return
    fi
    NOFT_MOUNTS+=("$d")
    python3 - "$d" <<'PY'
import os, socket, sys
d = sys.argv[1]
open(os.path.join(d, "file"), "w").close()
os.mkdir(os.path.join(d, "dir"))
os.symlink("file", os.path.join(d, "link"))
os.mkfifo(os.path.join(d, "fifo"))
sk = socket.socket(socket.AF_UNIX); sk.bind(os.path.join(d, "sock")); sk.close()
os.mknod(os.path.join(d, "chr"), 0o644 | 0o020000, os.makedev(1, 3))
os.mknod(os.path.join(d, "blk"), 0o644 | 0o060000, os.makedev(7, 200))
PY
    sync -f "$d/file"
    sync "$img"
}

# prepare_escape DIR: the canary outside the share for the escape suite: DIR/canary, a small
# tmpfs mounted `strictatime` (so that even a read moves an atime), holding secret and
# dir/inner; and in the share, escape/ with symlinks pointing at it (absolute, relative, a
# directory, through /proc/self/root, to /) and the random tail of the canary's content (the
# guest looks for the whole content in everything it managed to read). The canary's state,
# read with O_NOATIME, goes to DIR/canary-before.txt.
prepare_escape() {
    local dir="$1" s="$1/share" c="$1/canary" tag
    tag="$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
    mkdir -p "$c" "$s/escape"
    if mount -t tmpfs -o strictatime,size=1m,mode=0755 virtiofsd-canary "$c"; then
        NOFT_MOUNTS+=("$c")
    else
        echo "# note: no strictatime tmpfs for the canary; atimes compared on $(stat -f -c %T "$c")"
    fi
    mkdir "$c/dir"
    printf 'HOST-CANARY-%s\n' "$tag" > "$c/secret"
    printf 'HOST-CANARY-%s\n' "$tag" > "$c/dir/inner"
    printf '%s\n' "$tag" > "$s/escape/canary-marker"
    ln -s "$c/secret" "$s/escape/host-abs"
    ln -s ../../canary/secret "$s/escape/host-rel"
    ln -s ../../canary "$s/escape/host-dir"
    ln -s "/proc/self/root$c/secret" "$s/escape/host-proc"
    ln -s / "$s/escape/host-root"
    canary_state "$c" > "$dir/canary-before.txt"
}

# canary_state DIR: every path under DIR with mode, links, size, atime, mtime, ctime and content
# (md5) or listing, read with O_NOATIME so that looking changes nothing.
canary_state() {
    python3 - "$1" <<'PY'
import hashlib, os, stat, sys
root = sys.argv[1]
def walk(rel):
    p = os.path.join(root, rel)
    st = os.lstat(p)
    fd = os.open(p, os.O_RDONLY | os.O_NOATIME | os.O_NOFOLLOW)
    try:
        if stat.S_ISDIR(st.st_mode):
            names = sorted(os.listdir(fd))
            data = "/".join(names)
        else:
            names = []
            data = hashlib.md5(os.read(fd, 1 << 20)).hexdigest()
    finally:
        os.close(fd)
    print(rel, oct(st.st_mode), st.st_nlink, st.st_size, st.st_atime_ns, st.st_mtime_ns,
          st.st_ctime_ns, data)
    for n in names:
        walk(os.path.join(rel, n))
walk(".")
PY
}

# fds PID: the daemon's descriptors: number, dev:ino and type of what each refers to, the open
# flags (octal, from fdinfo) and the link text.
fds() {
    local f n
    for f in /proc/"$1"/fd/*; do
        n="${f##*/}"
        printf '%s %s %s %s\n' "$n" "$(stat -L -c '%d:%i %F' "$f" 2>/dev/null | tr ' ' _)" \
            "$(awk '/^flags:/ { print $2 }' "/proc/$1/fdinfo/$n" 2>/dev/null)" "$(readlink "$f")"
    done
}

unmount_nofiletype() {
    local m
    for m in "${NOFT_MOUNTS[@]}"; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    NOFT_MOUNTS=()
}
at_exit unmount_nofiletype

# prepare_tree DIR: 30,000 small files (f00..f29, 0-3 KiB) in 1,000 directories
# (dNN/sN, 100 x 10) plus 10 symlinks (dNN/ln, NN < 10) for the find-without-stat tests of the
# main suite: 31,111 paths with DIR itself. About 2-3 s.
prepare_tree() {
    python3 - "$1" <<'PY'
import os, sys
root = sys.argv[1]
os.mkdir(root)
for a in range(100):
    da = os.path.join(root, "d%02d" % a)
    os.mkdir(da)
    for b in range(10):
        db = os.path.join(da, "s%d" % b)
        os.mkdir(db)
        for c in range(30):
            fd = os.open(os.path.join(db, "f%02d" % c), os.O_CREAT | os.O_WRONLY, 0o644)
            if c % 10:
                os.write(fd, b"x" * ((a + b + c) % 4 * 1024))
            os.close(fd)
    if a < 10:
        os.symlink("s0/f00", os.path.join(da, "ln"))
PY
}

# fingerprint DIR: everything about a tree that a read-only mount must not change (not atime).
fingerprint() {
    (cd "$1" && find . -printf '%p %y %s %m %U:%G %l %T@\n' | LC_ALL=C sort)
    python3 - "$1" <<'PY'
import os, sys
for dp, dns, fns in os.walk(sys.argv[1]):
    for n in sorted(dns + fns):
        p = os.path.join(dp, n)
        try:
            print(p, sorted((a, os.getxattr(p, a, follow_symlinks=False)) for a in os.listxattr(p, follow_symlinks=False)))
        except OSError:
            pass
PY
}

# snapshot PID FILE: per-thread name and I/O counters of the daemon
snapshot() {
    local t
    # With --sandbox=namespace or chroot (namespace is the default) the daemon serves from a
    # child process: its threads are counted too.
    for t in /proc/"$1"/task/* $(for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
                                      echo /proc/"$c"/task/*; done); do
        [ -r "$t/io" ] || continue
        printf '%s %s %s %s\n' "${t##*/}" "$(cat "$t/comm" 2>/dev/null)" \
            "$(awk '/^rchar:/{r=$2} /^wchar:/{w=$2} END{print r, w}' "$t/io" 2>/dev/null)" \
            "$(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{print $12 + $13}')"
    done > "$2"
}

# prepare_locks SHARE: the files of the locks suite, in SHARE/locks.
prepare_locks() {
    local f
    mkdir -p "$1/locks"
    for f in flock posix ofd g-flock g-posix g-ofd range ofd2 kill sem sem-host; do
        head -c 4096 /dev/zero > "$1/locks/$f.f"
    done
    # The database two writers share (locks suite under --cache never): rollback journal.
    sqlite3 "$1/locks/db.sqlite" \
        'PRAGMA journal_mode=DELETE; CREATE TABLE t (who TEXT, i INTEGER);' > /dev/null
    chmod -R a+rwX "$1/locks"
}

# Transactions each SQLite writer makes (locks suite, --cache never).
SQLITE_ROWS=1000

# sqlite_writer DB WHO: SQLITE_ROWS inserts, each its own transaction, waiting for the
# database's locks as long as it takes (60 s at most each).
sqlite_writer() {
    { echo ".timeout 60000"; seq 1 "$SQLITE_ROWS" | sed "s/.*/INSERT INTO t VALUES ('$2', &);/"; } |
        sqlite3 "$1"
}

# host_try SHARE OUT: the host tries the locks the guest holds at the locks-guest-* marks
# (one line "NAME RESULT" each), with the static helper also used in the guest.
host_try() {
    local l="$1/locks" h="$WORK/helpers/locks"
    {
        echo "flock $("$h" try flock-ex "$l/g-flock.f" 0 0)"
        echo "posix $("$h" try posix-rd "$l/g-posix.f" 50 1)"
        echo "posix-after $("$h" try posix-wr "$l/g-posix.f" 100 10)"
        echo "ofd $("$h" try ofd-rd "$l/g-ofd.f" 0 0)"
        echo "getlk $("$h" getlk "$l/g-posix.f" 0 0 | cut -d' ' -f1-3)"
    } > "$2"
}

# locks_mark MARK SHARE LOGS: the host's side of the locks suite at its marks.
locks_mark() {
    local l="$2/locks"
    case "$1" in
        locks-host-hold)
            # Holds a flock, a POSIX lock on bytes 10-29 and an OFD lock until the guest makes
            # host-release.
            "$WORK/helpers/locks" hold "$l/host-holds" "$l/host-release" \
                flock-ex "$l/flock.f" 0 0 posix-wr "$l/posix.f" 10 20 ofd-wr "$l/ofd.f" 0 0 \
                > "$3/host-hold.txt" 2>&1 &
            track $!
            ;;
        locks-sqlite)
            # The host's writer, at the same time as the guest's; its exit status, then done.
            ( sqlite_writer "$l/db.sqlite" host > "$3/host-sqlite.txt" 2>&1
              echo "exit $?" >> "$3/host-sqlite.txt"; : > "$l/host-sqlite-done" ) &
            track $!
            ;;
        locks-guest-hold) host_try "$2" "$3/host-try-held.txt" ;;
        locks-guest-released) host_try "$2" "$3/host-try-released.txt" ;;
    esac
}

# prepare_locks2 SHARE SQLITE: the files of the two-guest locks suite (in-guest/suite-locks2.sh),
# in SHARE/l2: the lock files, the markers' directory, the database and, with SQLITE=1, its row
# count (which makes the guests and the host write it).
prepare_locks2() {
    local f
    mkdir -p "$1/l2/sync"
    for f in flock posix ofd range kill sh-flock sh-posix sh-ofd close-ofd close-posix close-flock; do
        head -c 4096 /dev/zero > "$1/l2/$f.f"
    done
    sqlite3 "$1/l2/db.sqlite" \
        'PRAGMA journal_mode=DELETE; CREATE TABLE t (who TEXT, i INTEGER);' > /dev/null
    [ "$2" = 1 ] && echo "$SQLITE_ROWS" > "$1/l2/sqlite-rows"
    chmod -R a+rwX "$1/l2"
}

# boot_pair KERNEL NAME SQLITE DAEMON_FLAGS...: two guests at once running the two-guest locks
# suite, each with its own daemon (DAEMON_FLAGS) on one share; with SQLITE=1 they write the
# database, and guest A's #MARK locks2-sqlite starts the host's SQLite writer.
boot_pair() {
    local k="$1" bname="$2" sqlite="$3"; shift 3
    local flags=("$@")
    BOOT_FLAGS="${flags[*]}"
    local dir="$WORK/$k-$bname" logs="$OUT/$k-$bname" prefix="[$k] $bname: "
    rm -rf "$logs"; mkdir -p "$dir/share" "$logs"
    local share="$dir/share" r x
    prepare_locks2 "$share" "$sqlite"
    echo "# boot: kernel $k, $bname (two guests at once, guest suite locks2, a daemon each), daemon flags: ${flags[*]}"
    local -A pdpid pqpid
    for r in a b; do
        start_daemon "$dir/vfs-$r.sock" "$share" "$logs/daemon-$r.log" "${flags[@]}" --log-level debug
        pdpid[$r]=$DPID
        if ! wait_socket "$dir/vfs-$r.sock" "$DPID"; then
            result fail "${prefix}daemon $r listens on its socket" "$(tail -n 20 "$logs/daemon-$r.log")"
            for x in a b; do [ -n "${pdpid[$x]:-}" ] && reap "${pdpid[$x]}" 0; done
            return
        fi
    done
    local t0=$SECONDS
    for r in a b; do
        start_guest "$logs/console-$r.log" "$logs/qemu-$r.log" "$CACHE/kernel-$k/vmlinuz" \
            "$WORK/initramfs-$k.cpio" 512M "guest_suite=locks2 guest_role=$r guest_cache=never" \
            -smp 2 -chardev "socket,id=vfs,path=$dir/vfs-$r.sock" \
            -device vhost-user-fs-pci,chardev=vfs,tag=share,num-request-queues=2
        pqpid[$r]=$QPID
    done
    pair_mark() {
        case "$1" in
            locks2-sqlite)
                ( sqlite_writer "$share/l2/db.sqlite" host > "$logs/host-sqlite.txt" 2>&1
                  echo "exit $?" >> "$logs/host-sqlite.txt"; : > "$share/l2/host-sqlite-done" ) &
                track $!
                ;;
        esac
    }
    local -A pqrc
    QPID=${pqpid[a]}
    watch_guest "$TIMEOUT" pair_mark "$logs/console-a.log"
    pqrc[a]="$QRC"
    local left=$((TIMEOUT - (SECONDS - t0)))
    [ "$left" -gt 0 ] || left=0
    reap "${pqpid[b]}" "$left"
    pqrc[b]="$REAPED"
    [ "${pqrc[b]}" = running ] && pqrc[b]=timeout
    echo "# the two guests took $((SECONDS - t0))s (QEMU exit status A ${pqrc[a]}, B ${pqrc[b]})"
    for r in a b; do
        local R="${r^^}" con="$logs/console-$r.log" drc
        reap "${pdpid[$r]}" 10
        drc="$REAPED"
        [ "$drc" = running ] && drc="still running 10 s after QEMU exited (killed)"
        touch "$con"
        report_tap "$con" "${prefix}$R: "
        if [ "${pqrc[$r]}" = timeout ]; then
            result fail "${prefix}guest $R finished within ${TIMEOUT}s" \
                "last test started: $(grep '^#RUN' "$con" | tail -n 1)
console tail:
$(tr -d '\r' < "$con" | tail -n 25)"
        elif ! grep -q '^#DONE' "$con"; then
            result fail "${prefix}guest $R ran to the end and powered off" \
                "QEMU exit status ${pqrc[$r]}; console tail:
$(tr -d '\r' < "$con" | tail -n 25)
qemu log:
$(tail -n 10 "$logs/qemu-$r.log")"
        else
            check "${prefix}guest $R powered off (QEMU exit status)" "${pqrc[$r]}" 0 "QEMU exit status"
        fi
        if [ "$drc" = 0 ]; then
            result ok "${prefix}daemon $r exits 0 after its guest disconnects"
        else
            result fail "${prefix}daemon $r exits 0 after its guest disconnects" \
                "daemon exit: $drc; log tail:
$(tail -n 15 "$logs/daemon-$r.log")"
        fi
    done
    host_checks_locks2 "$k" "$dir" "$logs" "$prefix" "$sqlite"
    return 0
}

host_checks_locks2() {
    local k="$1" dir="$2" logs="$3" prefix="$4" b="$3/console-b.log" w
    for w in posix flock ofd; do
        echo "# ${prefix}B's SETLKW ($w) woke $(data_of "$b" "setlkw-wait-$w-ms") ms after it began waiting (about 2 s of it before A's holder was told to exit)"
    done
    echo "# ${prefix}B's killed waiters (F_SETLKW, flock) were in state $(data_of "$b" killed-waiter-state) and were gone $(data_of "$b" killed-waiter-gone-ms) ms after B told A's holder to exit"
    if [ "$5" != 1 ]; then
        result skip "${prefix}SQLite writers in two guests and the host" \
            "run on the first kernel of the run only (${KERNELS%% *})"
        return
    fi
    check "${prefix}SQLite: the host's writer committed every transaction" \
        "$(cat "$logs/host-sqlite.txt" 2>/dev/null)" "exit 0" "host writer output"
    check "${prefix}SQLite: the database the host reads after the three writers" \
        "$(sqlite3 "$dir/share/l2/db.sqlite" 'PRAGMA integrity_check;' \
            "SELECT who || ' ' || count(*) || ' ' || count(DISTINCT i) FROM t GROUP BY who ORDER BY who;" 2>&1 | tr '\n' ' ')" \
        "ok guest-a $SQLITE_ROWS $SQLITE_ROWS guest-b $SQLITE_ROWS $SQLITE_ROWS host $SQLITE_ROWS $SQLITE_ROWS " \
        "integrity, rows per writer"
    echo "# ${prefix}SQLite: $SQLITE_ROWS transactions took $(data_of "$logs/console-a.log" sqlite-guest-s) s in A, $(data_of "$b" sqlite-guest-s) s in B, beside each other and the host's"
}

# boot_mark MARK (watch_guest's handler in boot, whose dpid, logs and share it uses): a
# snapshot of the daemon's threads and descriptors, and how far its request log had got.
boot_mark() {
    case "$1" in locks-*) locks_mark "$1" "$share" "$logs"; return 0 ;; esac
    snapshot "$dpid" "$logs/threads-$1.txt"
    fds "$dpid" > "$logs/fds-$1.txt"
    # how far the daemon's request log had got (requests between two marks)
    wc -l < "$logs/daemon.log" > "$logs/loglines-$1.txt"
    [ "$1" = host-delete ] && rm -f "$share/fixtures/host-deletes.txt"
    return 0
}

# boot KERNEL NAME SUITE DAEMON_FLAGS...: one guest boot running the guest suite SUITE against
# a fresh daemon and share
boot() {
    local k="$1" bname="$2" suite="$3"; shift 3
    local flags=("$@")
    BOOT_FLAGS="${flags[*]}"
    local dir="$WORK/$k-$bname" logs="$OUT/$k-$bname" prefix="[$k] $bname: "
    rm -rf "$logs"; mkdir -p "$dir" "$logs"
    local share="$dir/share" sock="$dir/vfs.sock"
    mkdir -p "$share"
    if [ "$suite" = escape ]; then
        prepare_escape "$dir"
    else
        prepare_share "$share"
        [ "$suite" = main ] && prepare_tree "$share/fixtures/tree30k"
        [ "$suite" = locks ] && prepare_locks "$share"
        prepare_nofiletype "$share/fixtures/nofiletype"
    fi
    [ "$suite" = readonly ] && fingerprint "$share" > "$dir/before.txt"

    echo "# boot: kernel $k, $bname (guest suite $suite), daemon flags: ${flags[*]}"
    start_daemon "$sock" "$share" "$logs/daemon.log" "${flags[@]}" --log-level debug
    local dpid=$DPID
    if ! wait_socket "$sock" "$dpid"; then
        result fail "${prefix}daemon listens on its socket" "$(tail -n 20 "$logs/daemon.log")"
        reap "$dpid" 0
        return
    fi

    # the cache mode, for the guest tests whose size depends on it
    local gcache=auto f prev=""
    for f in "${flags[@]}"; do
        [ "$prev" = --cache ] && gcache="$f"
        case "$f" in --cache=*) gcache="${f#--cache=}" ;; esac
        prev="$f"
    done
    local t0=$SECONDS
    start_guest "$logs/console.log" "$logs/qemu.log" "$CACHE/kernel-$k/vmlinuz" \
        "$WORK/initramfs-$k.cpio" 1G "guest_suite=$suite guest_cache=$gcache" -smp 2 \
        -chardev "socket,id=vfs,path=$sock" \
        -device vhost-user-fs-pci,chardev=vfs,tag=share,num-request-queues=2

    # Wait for the guest to power off; take a snapshot of the daemon's threads at each #MARK.
    watch_guest "$TIMEOUT" boot_mark "$logs/console.log"
    local qrc="$QRC" timed_out=0
    [ "$qrc" = timeout ] && timed_out=1
    local secs=$((SECONDS - t0))
    echo "# boot took ${secs}s (QEMU exit status $qrc)"

    # The daemon must notice the disconnect and exit 0 by itself.
    reap "$dpid" 10
    local drc="$REAPED"
    [ "$drc" = running ] && drc="still running 10 s after QEMU exited (killed)"

    local console="$logs/console.log"
    touch "$console"
    report_tap "$console" "$prefix"
    if [ "$timed_out" = 1 ]; then
        result fail "${prefix}guest finished within ${TIMEOUT}s" \
            "guest killed after ${TIMEOUT}s; last test started: $(grep '^#RUN' "$console" | tail -n 1)
console tail:
$(tr -d '\r' < "$console" | tail -n 25)
daemon log tail:
$(tail -n 15 "$logs/daemon.log")"
    elif ! grep -q '^#DONE' "$console"; then
        result fail "${prefix}guest ran to the end and powered off" \
            "QEMU exit status $qrc; console tail:
$(tr -d '\r' < "$console" | tail -n 25)
qemu log:
$(tail -n 10 "$logs/qemu.log")"
    else
        check "${prefix}guest powered off (QEMU exit status)" "$qrc" 0 "QEMU exit status"
    fi
    if [ "$drc" = 0 ]; then
        result ok "${prefix}daemon exits 0 after the guest unmounts and disconnects"
    else
        result fail "${prefix}daemon exits 0 after the guest unmounts and disconnects" \
            "daemon exit: $drc; log tail:
$(tail -n 15 "$logs/daemon.log")"
    fi
    [ -e "$sock" ] && echo "# note: the daemon left its socket file $sock behind"
    if [ "$suite" = main ] && grep -q '^#DONE' "$console"; then
        # The guest's umount sends FUSE_DESTROY before the device goes away.
        if grep -q 'opcode=DESTROY ' "$logs/daemon.log"; then
            result ok "${prefix}daemon received FUSE_DESTROY on unmount"
        else
            result fail "${prefix}daemon received FUSE_DESTROY on unmount" \
                "no 'request ... opcode=DESTROY' line in the debug log; log tail:
$(tail -n 10 "$logs/daemon.log")"
        fi
    fi

    host_checks_"$suite" "$k" "$dir" "$logs" "$prefix"
    [ "$suite" = main ] && host_checks_idmap "$k" "$dir" "$logs" "$prefix"
    local errs
    errs="$(grep -cE '\b(ERROR|WARN)\b' "$logs/daemon.log" || true)"
    [ "$errs" != 0 ] && echo "# daemon logged $errs WARN/ERROR lines (see $logs/daemon.log)"
    return 0
}

# boot_noshare K: QEMU with plain `-m 256M` (guest memory not shared with the daemon). QEMU
# gives the daemon no memory region, and setting up the queues fails: the daemon must exit 1
# with the one error that says guest memory is not shared and how to start QEMU, not the
# backend library's "invalid parameters". The guest then waits for its device: QEMU is killed.
boot_noshare() {
    local k="$1" dir="$WORK/$1-noshare" logs="$OUT/$1-noshare" prefix="[$1] noshare: "
    rm -rf "$logs"; mkdir -p "$dir/share" "$logs"
    local sock="$dir/vfs.sock"
    echo "# boot: kernel $k, noshare (QEMU -m 256M without a shared memory backend)"
    start_daemon "$sock" "$dir/share" "$logs/daemon.log"
    local dpid=$DPID
    wait_socket "$sock" "$dpid"
    GUEST_SHARED_MEM=0 start_guest "$logs/console.log" "$logs/qemu.log" \
        "$CACHE/kernel-$k/vmlinuz" "$WORK/initramfs-$k.cpio" 256M guest_suite=main \
        -chardev "socket,id=vfs,path=$sock" -device vhost-user-fs-pci,chardev=vfs,tag=share
    local qpid=$QPID t0=$SECONDS drc
    reap "$dpid" 60
    drc="$REAPED"
    [ "$drc" = running ] && drc="still running after 60 s (killed)"
    reap "$qpid" 0
    echo "# the daemon stopped after $((SECONDS - t0))s"
    check "${prefix}daemon exits 1 when guest memory is not shared" "$drc" 1 "exit status"
    local line
    line="$(grep 'ERROR' "$logs/daemon.log" | tail -n 1)"
    case "$line" in
        *"guest memory is not shared with virtiofsd"*share=on*)
            result ok "${prefix}daemon says guest memory is not shared, and share=on" "$line" ;;
        *) result fail "${prefix}daemon says guest memory is not shared, and share=on" \
            "last ERROR line: '$line'; log tail:
$(tail -n 10 "$logs/daemon.log")" ;;
    esac
    check "${prefix}no \"invalid parameters\" in the daemon's log" \
        "$(grep -c 'invalid parameters' "$logs/daemon.log")" 0 "lines"
}

host_stat() { stat -c "$1" "$2" 2>&1; }
host_xattr() {
    python3 -c 'import os,sys
try: print(os.getxattr(sys.argv[1], sys.argv[2]).decode())
except OSError as e: print("error:", e.strerror)' "$1" "$2"
}

# requests_between LOGS FROM TO OPCODES WHAT: the requests the daemon logged between the guest's
# marks FROM and TO whose opcode (its name, as the log gives it) matches the regex OPCODES:
# WHAT=count prints their number, WHAT=by-opcode " NAME:COUNT, ..." (run.sh took the log's
# length at each mark)
requests_between() {
    local a b lines
    a="$(cat "$1/loglines-$2.txt")"; b="$(cat "$1/loglines-$3.txt")"
    lines="$(sed -n "$((a + 1)),${b}p" "$1/daemon.log" | grep -oE "request unique=[0-9]+ opcode=$4 " || true)"
    if [ "$5" = count ]; then
        [ -n "$lines" ] && printf '%s\n' "$lines" | wc -l || echo 0
    else
        printf '%s\n' "$lines" | sed -n 's/.*opcode=//p' | sort | uniq -c |
            awk '{ printf "%s %s:%s", sep, $2, $1; sep = "," }'
    fi
}

host_checks_main() {
    local k="$1" dir="$2" logs="$3" prefix="${4}host: "
    local w="$dir/share/work" c="$logs/console.log"
    if ! grep -q '^#DONE' "$c"; then
        result fail "${prefix}checks of the share" "skipped: the guest did not finish"
        return
    fi
    local want got
    want="$(data_of "$c" big_sha256)"
    got="$(sha256sum "$w/big.bin" 2>&1 | cut -d' ' -f1)"
    if [ -n "$want" ] && [ "$got" = "$want" ]; then
        result ok "${prefix}64 MiB file sha256 matches the guest's"
    else
        result fail "${prefix}64 MiB file sha256 matches the guest's" "guest: '$want', host: '$got'"
    fi
    for f in a b; do
        want="$(data_of "$c" par_${f}_sha256)"
        got="$(sha256sum "$w/par-$f.bin" 2>&1 | cut -d' ' -f1)"
        if [ -n "$want" ] && [ "$got" = "$want" ]; then
            result ok "${prefix}parallel writer $f file sha256 matches the guest's"
        else
            result fail "${prefix}parallel writer $f file sha256 matches the guest's" "guest: '$want', host: '$got'"
        fi
    done
    check "${prefix}the no-filetype fixture really reports DT_UNKNOWN on the host" \
        "$("$WORK/helpers/getdents" "$dir/share/fixtures/nofiletype" 2>&1 | grep '^unknown ')" \
        "unknown 10" "host getdents64 count"
    check "${prefix}file rewritten with O_TRUNC holds only the new content" "$(cat "$w/otrunc.txt" 2>&1)" new content
    check "${prefix}0444 file unchanged by the refused writes" "$(cat "$w/ro-file.txt" 2>&1)" keep content
    check "${prefix}appended file content" "$(cat "$w/host-append.txt" 2>&1 | tr '\n' ,)" "line1,line2,line3," content
    check "${prefix}chown'd file is owned by 1234:5678" "$(host_stat %u:%g "$w/owned.txt")" 1234:5678 owner
    check "${prefix}file a guest user created is owned by 1000:1000" "$(host_stat %u:%g "$w/userdir/user-file")" 1000:1000 owner
    check "${prefix}dir a guest user created is owned by 1000:1000" "$(host_stat %u:%g "$w/userdir/user-dir")" 1000:1000 owner
    check "${prefix}file the guest created as root is owned by 0:0" "$(host_stat %u:%g "$w/created.txt")" 0:0 owner
    check "${prefix}chmod'd mode" "$(host_stat %a "$w/mode.txt")" 600 mode
    check "${prefix}mtime set by touch -d" "$(host_stat %Y "$w/times.txt")" 981173106 mtime
    check "${prefix}atime set by touch -a -d" "$(host_stat %X "$w/times.txt")" 946684798 atime
    check "${prefix}mknod char device 240:300" "$(host_stat '%F %t:%T' "$w/chr-big")" "character special file f0:12c" "type major:minor"
    check "${prefix}mkfifo made a fifo" "$(host_stat %F "$w/host-fifo")" fifo type
    check "${prefix}symlink target" "$(readlink "$w/host-symlink" 2>&1)" sl-target target
    check "${prefix}hard link pair shares an inode with 2 links" \
        "$(host_stat %h "$w/hl-kept-a") $( [ "$(host_stat %i "$w/hl-kept-a")" = "$(host_stat %i "$w/hl-kept-b")" ] && echo same || echo different)" \
        "2 same" "links, inode"
    check "${prefix}xattr the guest set" "$(host_xattr "$w/xa.txt" user.kept)" kept-value value
    check "${prefix}xattr the guest removed is gone" "$(host_xattr "$w/xa.txt" user.greeting)" "error: No data available" value
    check "${prefix}file unlinked while open is gone" "$(find "$w" -maxdepth 1 -name 'unlinked*' | wc -l)" 0 "entries named unlinked*"
    check "${prefix}rm -rf'd tree is gone" "$( [ -e "$w/tree" ] && echo present || echo gone)" gone tree
    # what the find-30k tests of the guest counted (printed even when they pass)
    for m in all type_f; do
        got="$(data_of "$c" "find_stats_$m")"
        [ -n "$got" ] && echo "# ${prefix%host: }find-30k ($m): $got"
    done
    # The warm tar of the 30k tree (tar-30k-warm-reread): requests the daemon received between
    # the warm-start and warm-end marks, by opcode. With --cache always the guest sends no
    # OPEN, RELEASE, FLUSH, OPENDIR or RELEASEDIR: the daemon answers OPEN, OPENDIR and FLUSH
    # with ENOSYS once and the kernel stops sending them.
    got="$(data_of "$c" tar_30k)"
    [ -n "$got" ] && echo "# ${prefix%host: }tar of the 30k tree: $got"
    local name="${prefix}warm re-read of the 30k tree sends no OPEN/FLUSH/RELEASE with --cache always"
    if [ -f "$logs/loglines-warm-start.txt" ] && [ -f "$logs/loglines-warm-end.txt" ]; then
        local counts opens
        counts="$(requests_between "$logs" warm-start warm-end '[A-Z0-9_]+' by-opcode)"
        opens="$(requests_between "$logs" warm-start warm-end '(OPEN|RELEASE|FLUSH|OPENDIR|RELEASEDIR)' count)"
        echo "# ${prefix%host: }requests during the warm tar: ${counts:-none}"
        if [[ " $BOOT_FLAGS " != *" --cache always "* ]]; then
            result skip "$name" "not --cache always; OPEN/RELEASE/FLUSH/OPENDIR/RELEASEDIR: $opens"
        elif [ "$opens" = 0 ]; then
            result ok "$name" "requests during the warm tar: ${counts:-none}"
        else
            result fail "$name" "$opens OPEN/RELEASE/FLUSH/OPENDIR/RELEASEDIR requests; all: $counts"
        fi
    else
        result fail "$name" "no daemon log positions were taken at the warm-start/warm-end marks"
    fi

    # The warm find after the timeout (find-30k-after-the-timeout): in --cache=auto one request
    # per page of a listing plus a few per directory (OPENDIR, RELEASEDIR, the read that finds
    # the end), never one per entry. The tree: the root (102 entries, 5 pages of READDIRPLUS
    # at 25 entries of these names each), 100 directories of 13 (1 page), 1,000 of 32 (2).
    name="${prefix}a warm find after the timeout sends a request per listing page, not per file"
    if [ -f "$logs/loglines-findwarm-start.txt" ] && [ -f "$logs/loglines-findwarm-end.txt" ]; then
        local fcounts ftotal flimit=$(( (5 + 100 + 2000) + 4 * 1101 ))
        fcounts="$(requests_between "$logs" findwarm-start findwarm-end '[A-Z0-9_]+' by-opcode)"
        ftotal="$(requests_between "$logs" findwarm-start findwarm-end '[A-Z0-9_]+' count)"
        echo "# ${prefix%host: }requests during the warm find after the timeout: $ftotal (${fcounts:-none})"
        if [[ " $BOOT_FLAGS " != *" --cache auto "* ]]; then
            result skip "$name" "not --cache auto: $ftotal requests"
        elif [ "$ftotal" -le "$flimit" ]; then
            result ok "$name" "$ftotal requests (at most $flimit): ${fcounts:-none}"
        else
            result fail "$name" "$ftotal requests, more than $flimit (2,105 listing pages + 4 per directory): $fcounts"
        fi
    else
        result fail "$name" "no daemon log positions were taken at the findwarm-start/findwarm-end marks"
    fi

    got="$(data_of "$c" statfs)"
    check "${prefix}statfs block size, blocks, inodes match the host's" "$got" "$(stat -f -c '%S %b %c' "$dir/share")" "bsize blocks files"

    # Two request queues: the daemon runs one thread per virtqueue ("vring_worker", in queue
    # order: hiprio, request 0, request 1, ...). During the parallel workload each request queue
    # that served requests shows read/write syscall bytes on its thread.
    local name="${prefix}both request queues served the parallel workload"
    local gk
    gk="$(sed -n 's/^#GUEST kernel=\([0-9]*\.[0-9]*\).*/\1/p' "$c" | tr -d '\r' | head -n 1)"
    if [ ! -f "$logs/threads-parallel-start.txt" ] || [ ! -f "$logs/threads-parallel-end.txt" ]; then
        result fail "$name" "no thread snapshots were taken at the parallel-start/parallel-end marks"
    else
        local report busy
        report="$(join <(sort "$logs/threads-parallel-start.txt") <(sort "$logs/threads-parallel-end.txt") |
            awk '$2 == "vring_worker" { printf "thread %s: %.1f MiB read+written, %d cpu ticks\n", $1, (($7 - $3) + ($8 - $4)) / 1048576, $9 - $5 }' |
            sort -n -k2 | awk '$3 + 0 > 0' | paste -sd ';' - | sed 's/;/; /g')"
        [ -n "$report" ] || report="no vring_worker thread moved any bytes"
        busy="$(printf '%s\n' "$report" | tr ';' '\n' | awk '$3 + 0 >= 1 { n++ } END { print n + 0 }')"
        if [[ " $BOOT_FLAGS " = *" --thread-pool-size "* ]]; then
            result skip "$name" "with --thread-pool-size the pool threads, not the queue threads, do the I/O"
        elif [ "$(printf '%s\n' "$gk" | awk -F. '{ print ($1 * 100 + $2 >= 611) }')" != 1 ]; then
            result skip "$name" "guest kernel $gk predates multi-queue virtiofs (6.11); per-thread I/O: $report"
        elif [ "$busy" -ge 2 ]; then
            result ok "$name" "$report"
        else
            result fail "$name" "only $busy vring_worker thread(s) moved >= 1 MiB during the parallel phase: $report"
        fi
    fi
}

# After the idmap suite (in-guest/suite-idmap.sh, run in main-suite boots): what the guest made
# through its idmapped mount is owned on the host by the mapped ids (0 -> 100000,
# 1000 -> 101000), and, with FUSE_ALLOW_IDMAP agreed, only creating requests carried caller ids
# (every other request uid=gid=4294967295, FUSE_INVALID_UIDGID). Skipped before 6.12.
host_checks_idmap() {
    local k="$1" dir="$2" logs="$3" prefix="${4}host: idmap: "
    local w="$dir/share/work/idmap" c="$logs/console.log" gk
    gk="$(sed -n 's/^#GUEST kernel=\([0-9]*\.[0-9]*\).*/\1/p' "$c" | tr -d '\r' | head -n 1)"
    if [ "$(printf '%s\n' "$gk" | awk -F. '{ print ($1 * 100 + $2 >= 612) }')" != 1 ]; then
        result skip "${prefix}owners of files made through an idmapped mount" \
            "guest kernel $gk predates FUSE_ALLOW_IDMAP (6.12)"
        return
    fi
    if ! grep -q '^ok [0-9]* idmap-mount-virtiofs' "$c"; then
        result fail "${prefix}owners of files made through an idmapped mount" \
            "skipped: the guest made no idmapped mount"
        return
    fi
    local n
    for n in root-file root-dir root-symlink root-fifo chowned; do
        local want=100000:100000
        [ "$n" = chowned ] && want=100042:100043
        check "${prefix}$n made by guest root through the idmapped mount is owned by $want" \
            "$(host_stat %u:%g "$w/$n")" "$want" owner
    done
    for n in udir udir/user-file udir/user-dir; do
        check "${prefix}$n of guest user 1000 through the idmapped mount is owned by 101000:101000" \
            "$(host_stat %u:%g "$w/$n")" 101000:101000 owner
    done
    check "${prefix}file made by guest root through the plain mount is owned by 0:0" \
        "$(host_stat %u:%g "$w/plain-root-file")" 0:0 owner
    # Daemon debug log: "request unique=U opcode=O nodeid=N len=L uid=X gid=Y".
    local session creating other
    session="$(grep -o 'FUSE session started: protocol [0-9.]*, flags 0x[0-9a-f]*' "$logs/daemon.log" | tail -n 1)"
    if [ -n "$session" ] && [ $(( ${session##* } >> 40 & 1 )) = 1 ]; then
        result ok "${prefix}FUSE_ALLOW_IDMAP agreed in FUSE_INIT" "$session"
    else
        result fail "${prefix}FUSE_ALLOW_IDMAP agreed in FUSE_INIT" "daemon log: '$session'"
    fi
    # MKNOD, MKDIR, SYMLINK, CREATE carry ids; LOOKUP, GETATTR, SETATTR, OPEN, WRITE, UNLINK,
    # LINK must not. Only the requests of the idmap suite are checked (from its idmap-start
    # mark): the guest kernel gives a submount (--announce-submounts) a super block of its own,
    # whose requests carry ids whatever FUSE_ALLOW_IDMAP says.
    # One exception: with --writeback the kernel's flusher writes dirty pages back whoever
    # dirtied them, as a WRITE with FUSE_WRITE_CACHE (write_flags bit 0) and no caller at all
    # (header uid=gid=pid=0, the kernel's "nocreds" requests). Those are told apart by the
    # daemon's "write unique=U ... write_flags=F" debug line and not counted; any other WRITE
    # with ids is, and so is a write-back in a boot without --writeback.
    local from=1 reqlog="$logs/idmap-requests.log"
    [ -s "$logs/loglines-idmap-start.txt" ] && from=$(( $(cat "$logs/loglines-idmap-start.txt") + 1 ))
    tail -n "+$from" "$logs/daemon.log" > "$reqlog"
    local u f wbfile="$logs/idmap-writeback-uniques.txt" withids="$logs/idmap-requests-with-ids.log"
    sed -n 's/.* write unique=\([0-9]*\) .* write_flags=\(0x[0-9a-f]*\).*/\1 \2/p' "$reqlog" |
        while read -r u f; do (( f & 1 )) && echo "$u"; done > "$wbfile"
    creating="$(grep -E 'request unique=[0-9]+ opcode=(SYMLINK|MKNOD|MKDIR|CREATE) ' "$reqlog" |
        grep -vc 'uid=4294967295' || true)"
    # non-creating requests with ids into $withids, without the write-backs (WRITE_CACHE,
    # uid=gid=0), which are counted instead
    local flushed
    : > "$withids"
    flushed="$(grep -E 'request unique=[0-9]+ opcode=(LOOKUP|GETATTR|SETATTR|UNLINK|LINK|OPEN|WRITE) ' "$reqlog" |
        grep -v 'uid=4294967295 gid=4294967295' |
        awk -v out="$withids" 'FILENAME == ARGV[1] { wb[$1] = 1; next }
             { u = $0; sub(/.*request unique=/, "", u); sub(/ .*/, "", u) }
             / opcode=WRITE / && / uid=0 gid=0$/ && (u in wb) { n++; next }
             { print > out }
             END { close(out); print n + 0 }' "$wbfile" -)"
    other="$(wc -l < "$withids")"
    if [[ " $BOOT_FLAGS " != *" --writeback "* ]] && [ "$flushed" != 0 ]; then
        result fail "${prefix}only creating requests carry caller ids" \
            "$flushed page cache write-backs (WRITE_CACHE) in a boot without --writeback"
    elif [ "$creating" -gt 0 ] && [ "$other" = 0 ]; then
        result ok "${prefix}only creating requests carry caller ids" \
            "$creating creating requests with ids; every other one checked had uid=gid=4294967295 (not counted: $flushed page cache write-backs with uid=gid=0)"
    else
        result fail "${prefix}only creating requests carry caller ids" \
            "creating requests with ids: $creating; non-creating requests with ids: $other (not counted: $flushed page cache write-backs)
$(head -n 5 "$withids")"
    fi
}

host_checks_locks() {
    local k="$1" dir="$2" logs="$3" prefix="$4" con="$3/console.log" f
    f="$logs/host-try-held.txt"
    check "${prefix}the host is refused the guest's flock, POSIX and OFD locks" \
        "$(tr '\n' ' ' < "$f" 2>/dev/null)" \
        "flock EAGAIN posix EAGAIN posix-after ok ofd EAGAIN getlk W 0 100 " "host attempts"
    f="$logs/host-try-released.txt"
    check "${prefix}the host gets them once the guest process exited" \
        "$(tr '\n' ' ' < "$f" 2>/dev/null)" \
        "flock ok posix ok posix-after ok ofd ok getlk unlocked " "host attempts"
    check "${prefix}the host's holder took its locks" "$(cat "$logs/host-hold.txt" 2>/dev/null)" "" \
        "host holder output"
    # The guest's semantics checks (suite-locks.sh) run by a host process on the share itself:
    # the expectations are those of Linux on a local file system.
    local sem
    sem="$("$WORK/helpers/locks" semantics "$dir/share/locks/sem-host.f" local 2>&1)"
    check "${prefix}host: the OFD, POSIX and flock semantics checks hold on the host's own file" \
        "$(printf '%s\n' "$sem" | grep -v '^ok ' | head -n 5)" "" "failed checks"
    local w
    for w in posix flock ofd; do
        echo "# ${prefix}SETLKW ($w) woke $(data_of "$con" "setlkw-wait-$w-ms") ms after it began waiting (about 1 s of it before the release)"
    done
    echo "# ${prefix}a killed waiter was in state $(data_of "$con" killed-waiter-state) and was gone $(data_of "$con" killed-waiter-gone-ms) ms after the holder's release"
    if [ -f "$logs/host-sqlite.txt" ]; then
        check "${prefix}SQLite: the host's writer committed every transaction" \
            "$(cat "$logs/host-sqlite.txt")" "exit 0" "host writer output"
        check "${prefix}SQLite: the database the host reads after both writers" \
            "$(sqlite3 "$dir/share/locks/db.sqlite" 'PRAGMA integrity_check;' \
                "SELECT who || ' ' || count(*) || ' ' || count(DISTINCT i) FROM t GROUP BY who ORDER BY who;" 2>&1 | tr '\n' ' ')" \
            "ok guest $SQLITE_ROWS $SQLITE_ROWS host $SQLITE_ROWS $SQLITE_ROWS " "integrity, rows per writer"
        echo "# ${prefix}SQLite: the guest's $SQLITE_ROWS transactions took $(data_of "$con" sqlite-guest-s) s beside the host's"
    fi
}

host_checks_readonly() {
    local k="$1" dir="$2" logs="$3" prefix="${4}host: "
    fingerprint "$dir/share" > "$dir/after.txt"
    if diff -u "$dir/before.txt" "$dir/after.txt" > "$logs/share-diff.txt"; then
        result ok "${prefix}share unchanged by the read-only boot"
    else
        result fail "${prefix}share unchanged by the read-only boot" "$(head -n 20 "$logs/share-diff.txt")"
    fi
}

# The --xattrmap of the xattr boot: ACL attributes unchanged, guest user.* under user.guest.
XATTR_MAP="/ok/all/system.posix_acl_/system.posix_acl_/ /map/user./user.guest./"

host_checks_xattr() {
    local k="$1" dir="$2" logs="$3" prefix="${4}host: "
    local w="$dir/share/xw" c="$logs/console.log" flags
    if ! grep -q '^#DONE' "$c"; then
        result fail "${prefix}checks of the share" "skipped: the guest did not finish"
        return
    fi
    # INIT agreed POSIX_ACL (bit 20), DONT_MASK (6), SETXATTR_EXT (29), HANDLE_KILLPRIV_V2 (28)
    # and SECURITY_CTX (32).
    flags="$(sed -n 's/.*FUSE session started: .*flags \(0x[0-9a-f]*\).*/\1/p' "$logs/daemon.log" | tail -n 1)"
    local want=$(( (1 << 20) | (1 << 6) | (1 << 29) | (1 << 28) | (1 << 32) ))
    if [ -n "$flags" ] && [ $(( flags & want )) = "$want" ]; then
        result ok "${prefix}INIT agreed POSIX ACLs, KILLPRIV_V2 and SECURITY_CTX" "flags $flags"
    else
        result fail "${prefix}INIT agreed POSIX ACLs, KILLPRIV_V2 and SECURITY_CTX" \
            "flags '$flags', wanted bits $(printf '%#x' "$want")"
    fi
    check "${prefix}guest user.color is stored as user.guest.user.color" \
        "$(host_xattr "$w/f" user.guest.user.color)" blue value
    check "${prefix}no unprefixed user.color on the host" \
        "$(host_xattr "$w/f" user.color)" "error: No data available" value
    check "${prefix}a guest name that looks prefixed is prefixed again" \
        "$(host_xattr "$w/f" user.guest.user.guest.user.sneaky) $(host_xattr "$w/f" user.guest.user.sneaky)" \
        "v error: No data available" values
    check "${prefix}default ACL stored on the host directory" \
        "$(python3 -c 'import os,sys; print(len(os.getxattr(sys.argv[1], "system.posix_acl_default")))' "$w/acl" 2>&1)" \
        28 "ACL length"
    check "${prefix}file under the default ACL is mode 664" "$(host_stat %a "$w/acl/f")" 664 mode
    check "${prefix}file without a default ACL is mode 644" "$(host_stat %a "$w/plain/f")" 644 mode
    check "${prefix}unprivileged write cleared set-user-id" "$(host_stat %a "$w/suid")" 777 mode
    check "${prefix}unprivileged truncate cleared set-group-id" "$(host_stat %a "$w/sgid")" 777 mode
    check "${prefix}labelled creations exist" "$(ls "$w/label" 2>&1 | tr '\n' ' ')" "d f l p " names
}

# After the escape suite: the canary outside the share is unchanged and unread (its atimes
# included, on a strictatime tmpfs), the canary can tell (a read now does move its atime), the
# daemon held no device node or FIFO the guest made open for I/O while the guest had them open
# (O_PATH descriptors open nothing), and a hard link to a symlink pointing out stayed a symlink.
host_checks_escape() {
    local k="$1" dir="$2" logs="$3" prefix="${4}host: "
    local e="$dir/share/escape" c="$dir/canary" con="$logs/console.log"
    canary_state "$c" > "$dir/canary-after.txt"
    if diff -u "$dir/canary-before.txt" "$dir/canary-after.txt" > "$logs/canary-diff.txt"; then
        result ok "${prefix}canary outside the share unchanged and unread (content, times, atime)"
    else
        result fail "${prefix}canary outside the share unchanged and unread (content, times, atime)" \
            "$(head -n 20 "$logs/canary-diff.txt")"
    fi
    local a0 a1
    a0="$(stat -c %X.%x "$c/secret")"
    cat "$c/secret" >/dev/null
    a1="$(stat -c %X.%x "$c/secret")"
    if [ "$a0" != "$a1" ]; then
        result ok "${prefix}the canary notices a read (its atime moves)"
    else
        result fail "${prefix}the canary notices a read (its atime moves)" \
            "atime stayed $a0 after a read; mount: $(findmnt -n -o FSTYPE,OPTIONS -T "$c")"
    fi
    if ! grep -q '^#DONE' "$con"; then
        result fail "${prefix}checks of the escape share" "skipped: the guest did not finish"
        return
    fi
    local f="$logs/fds-devices-open.txt" n held=""
    if [ ! -s "$f" ]; then
        result fail "${prefix}daemon never opens a device node or FIFO the guest made" \
            "no descriptor list was taken at the devices-open mark"
    else
        for n in mem null sda fifo; do
            local id
            id="$(stat -c %d:%i "$e/$n" 2>/dev/null)" || continue
            # flags are octal; O_PATH is 010000000
            held+="$(awk -v id="$id" '$2 ~ "^" id "_" && int(substr($3, length($3) - 7, 1)) % 2 == 0 { print }' "$f")"
        done
        if [ -z "$held" ]; then
            result ok "${prefix}daemon never opens a device node or FIFO the guest made" \
                "$(wc -l < "$f") descriptors at the mark"
        else
            result fail "${prefix}daemon never opens a device node or FIFO the guest made" "$held"
        fi
    fi
    check "${prefix}the guest's device nodes are plain nodes in the share" \
        "$(host_stat '%F %t:%T' "$e/mem"), $(host_stat '%F %t:%T' "$e/sda"), $(host_stat %F "$e/fifo")" \
        "character special file 1:1, block special file 8:0, fifo" "type major:minor"
    check "${prefix}hard link to a symlink pointing out is that symlink" \
        "$(host_stat %F "$e/hl-abs") -> $(readlink "$e/hl-abs" 2>&1)" "symbolic link -> $c/secret" "type -> target"
    # shellcheck disable=SC2010 # the names here are the test's own, plain ones
    check "${prefix}no file appeared next to the share" \
        "$(cd "$dir" && ls -A | grep -vxE 'share|canary|canary-(before|after).txt|vfs.sock' | tr '\n' ' ')" "" "unexpected entries"
}

# --- the boots ---------------------------------------------------------------------------------
for k in $KERNELS; do
    [ -f "$WORK/initramfs-$k.cpio" ] || build_initramfs "$k" "$WORK/initramfs-$k.cpio"
    for s in $SUITES; do
        case "$s" in
            main) boot "$k" main main --xattr --cache auto ;;
            readonly) boot "$k" readonly readonly --readonly --xattr --announce-submounts ;;
            cache-never) boot "$k" cache-never main --xattr --cache never --thread-pool-size 4 ;;
            writeback) boot "$k" writeback main --xattr --cache always --writeback ;;
            xattr) boot "$k" xattr xattr --posix-acl --security-label=auto --killpriv-v2 \
                "--xattrmap=$XATTR_MAP" ;;
            escape) boot "$k" escape escape --xattr ;;
            always) boot "$k" always main --xattr --cache always --posix-lock=off --flock=off ;;
            locks) boot "$k" locks locks --cache auto ;;
            locks-always) boot "$k" locks-always locks --cache always ;;
            locks-never) boot "$k" locks-never locks --cache never ;;
            locks-guests) boot_pair "$k" locks-guests "$([ "$k" = "$first_kernel" ] && echo 1)" \
                --cache never ;;
            noshare) boot_noshare "$k" ;;
        esac
    done
done
finish
