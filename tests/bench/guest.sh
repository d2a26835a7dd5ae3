#!/usr/bin/env bash
# Guest benchmark: what a Linux guest sees. Boots a guest under QEMU (TCG by default) on the
# guest-test kit (tests/guest/: QEMU 10, the Debian 6.12 generic kernel, a busybox initramfs with
# the host's GNU find, ls, du, tar, grep, wc, make and Debian's tcc) and times, inside the
# guest, a fixed list of steps on one generated tree (and a C project made in it) served by
#   ours   target/release/virtiofsd
#   ref    the reference virtiofsd 1.14 (/opt/ref-virtiofsd/bin/virtiofsd; installed if missing)
#   9p     QEMU's own 9p server (-fsdev local + virtio-9p-pci), mounted in the guest with
#          NINEP_OPTS (default trans=virtio,version=9p2000.L,msize=512 KiB,cache=loose: 9p's
#          fastest mode, where the guest keeps pages, attributes and entries like --cache=always)
#   tmpfs  no daemon: the same tree made on a tmpfs inside the guest, by the same generator
#   nolocks  (only when --columns names it) ours again with --posix-lock=off --flock=off added:
#          the guest's locks stay in the guest, and --cache=always runs in no-open mode (no
#          OPEN, FLUSH, RELEASE, OPENDIR, RELEASEDIR); a second table sets it beside ours
# one boot per column per round, alternating (ours, ref, 9p, tmpfs, ours, ...) in the order
# --columns gives. Prints seconds per step (medians over the rounds), the ratios, whether the
# targets of issues 8 and 14 are met, and one line describing the machine. A benchmark, not a
# test: tests/run.sh does not run it.
#
# Steps (from the tree's root; "cold" = after `echo 3 > /proc/sys/vm/drop_caches` in the guest):
#   find-cold, find-warm   find . | wc -l
#   find-hot               the same a third time
#   stat-rtt               2,000 statx(".", AT_STATX_FORCE_SYNC): one round trip each (a
#                          GETATTR on virtio-fs); a diagnostic of the guest-visible round-trip
#                          time, left out of the "no step slower" check
#   find-type-f            find . -type f | wc -l
#   ls-lR                  ls -lR | wc -l
#   du-s                   du -s .
#   tar-cold, tar-warm     tar cf - . | wc -c
#   grep-r                 grep -r NEEDLE . | wc -l      (every 10th file has the needle)
#   git-status             git status --porcelain | wc -l  (the host made the tree a git
#                          repository, objects packed; not in the tmpfs column)
#   create-rm              create N empty files in a new directory, unlink them, rmdir
#   read-cold              read every file (open, read, close; nothing stat'ed): benchtool readtree
#   stat-after-read        drop caches and read every file (untimed), then lstat every entry
#                          (benchtool lstattree): the stat a tool makes after a first read (GNU
#                          tar right after reading each file, ls -l, make); on virtio-fs the guest
#                          asks the daemon again (a READ invalidates the cached atime)
#   stat-warm              lstat every entry again
# Each step that is not cold and does not follow the one before at once (find-hot, stat-rtt,
# stat-after-read) runs --wait seconds after the step before it, so that in --cache=auto the
# guest's entries and attributes (1 s) have expired: what a user who comes back to a tree sees.
# Then, in a C project of --build N sources (benchtool mkproj: 8 source directories, 6 include
# directories searched in order with -I, most includes found only in a later one; made fresh in
# the tree by the guest in every boot, untimed, and removed at the end):
#   build-cold             drop caches, then make -j2 (tcc -c -MD for every source)
#   build-noop             make -j2 again (every target up to date)
#   build-incr             touch 5 sources in 5 directories, make -j2
#   objs-read              cat src/*/*.o | wc -c
#   clean                  make clean
#
# Usage: tests/bench/guest.sh [options]        (as root)
#   --files N        files in the tree (default 30000), 0-4 KiB each
#   --dirs N         leaf directories holding them (default 1000; ten per parent directory)
#   --seed N         generator seed (default 1)
#   --churn N        files the create-rm step creates and removes (default 2000)
#   --build N        sources of the build steps' project (default 400; 0 leaves the build out)
#   --rounds N       boots per column (default 1); the table shows medians
#   --columns LIST   comma-separated subset of ours,ref,9p,tmpfs,nolocks (default
#                    ours,ref,9p,tmpfs)
#   --cache MODES    --cache= of both daemons: one of never, metadata, auto, always, a
#                    comma-separated list, or all (default always); the boots of each mode
#                    run after the previous mode's, and each mode gets its own table
#   --wait S         seconds to wait before a warm step (default 2; 0 runs them back to back)
#   --kernel K       guest kernel: 6.12-generic (default; has 9p), 6.12 or 6.1 (the cloud kernels
#                    of the guest tests; no 9p)
#   --accel A        tcg (default), kvm, or auto (KVM when a probe boot proves it works)
#   --mem MIB        guest RAM in MiB (default 2048); --smp N guest CPUs (default 2)
#   --timeout S      kill a guest still running after S seconds (default 1800)
#   --tree DIR       where the host tree is generated (default /var/tmp/virtiofsd-guest-bench)
#   --daemon PATH    measure this binary as "ours" (implies --no-build)
#   --no-build       do not run cargo build
#   --requests       count requests instead of measuring: both daemons run with
#                    --log-level=debug and the guest makes an FSYNCDIR before and after each
#                    step (and adds the diagnostic steps cc-one-new and cc-one-over: one tcc -c
#                    to a new object, then over it); prints the requests of each step by opcode,
#                    ours beside the reference's (requests.md). The times of such a run are
#                    slowed down by the logging
# Environment:
#   OURS_FLAGS, REF_FLAGS  more flags for each daemon (default none: each daemon's own defaults
#                          besides --cache; both are started as root)
#   QUEUES                 num-request-queues of the vhost-user-fs-pci device (default 1)
#   NINEP_OPTS             mount options of the 9p column (default above)
#   REF_ROOT               where the reference is installed (default /opt/ref-virtiofsd)
# Logs (console, daemon, QEMU per boot), the raw times (times.tsv) and the table (result.md) go
# to target/guest-bench/. Exit status 0 when every boot ran every step with the expected output
# (the targets do not affect it), 1 otherwise, 2 on a bad command line.
set -uo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="$ROOT/target/guest-bench"
# shellcheck source=tests/bench/reference.sh
. "$HERE/reference.sh"
# shellcheck source=tests/lib/proc.sh
. "$ROOT/tests/lib/proc.sh"
# shellcheck source=tests/lib/daemon.sh
. "$ROOT/tests/lib/daemon.sh"
# shellcheck source=tests/lib/accel.sh
. "$ROOT/tests/lib/accel.sh"
# shellcheck source=tests/lib/guest.sh
. "$ROOT/tests/lib/guest.sh"

FILES=30000 DIRS=1000 SEED=1 CHURN=2000 BUILD_SOURCES=400 REQUESTS=0 ROUNDS=1 COLUMNS="ours,ref,9p,tmpfs" CACHE_MODES=always WAIT=2
KERNEL=6.12-generic ACCEL=tcg MEM=2048 SMP=2 TIMEOUT=1800 TREE=/var/tmp/virtiofsd-guest-bench
DAEMON="" BUILD=1
QUEUES="${QUEUES:-1}"
NINEP_OPTS="${NINEP_OPTS:-trans=virtio,version=9p2000.L,msize=524288,cache=loose}"
read -r -a OURS_EXTRA <<< "${OURS_FLAGS:-}"
read -r -a REF_EXTRA <<< "${REF_FLAGS:-}"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
bad() { echo "guest.sh: $*" >&2; exit 2; }
num() { [[ "$2" =~ ^[0-9]+$ ]] || bad "$1 takes a number, got '$2'"; }
while [ $# -gt 0 ]; do
    opt="$1"
    case "$opt" in
        --*=*) val="${opt#*=}"; opt="${opt%%=*}"; shift ;;
        --files|--dirs|--seed|--churn|--build|--rounds|--columns|--cache|--wait|--kernel|--accel|--mem|--smp|--timeout|--tree|--daemon)
            [ $# -ge 2 ] || bad "$opt needs a value"
            val="$2"; shift 2 ;;
        *) val=""; shift ;;
    esac
    case "$opt" in
        --files) num "$opt" "$val"; FILES="$val" ;;
        --dirs) num "$opt" "$val"; DIRS="$val" ;;
        --seed) num "$opt" "$val"; SEED="$val" ;;
        --churn) num "$opt" "$val"; CHURN="$val" ;;
        --build) num "$opt" "$val"; BUILD_SOURCES="$val" ;;
        --requests) REQUESTS=1 ;;
        --rounds) num "$opt" "$val"; ROUNDS="$val" ;;
        --columns) COLUMNS="$val" ;;
        --cache) CACHE_MODES="$val" ;;
        --wait) num "$opt" "$val"; WAIT="$val" ;;
        --kernel) KERNEL="$val" ;;
        --accel) ACCEL="$val" ;;
        --mem) num "$opt" "$val"; MEM="$val" ;;
        --smp) num "$opt" "$val"; SMP="$val" ;;
        --timeout) num "$opt" "$val"; TIMEOUT="$val" ;;
        --tree) TREE="$val" ;;
        --daemon) DAEMON="$val"; BUILD=0 ;;
        --no-build) BUILD=0 ;;
        -h|--help) usage 0 ;;
        *) echo "guest.sh: unknown option $opt" >&2; usage 2 ;;
    esac
done
if [ "$DIRS" -lt 1 ] || [ "$DIRS" -gt 100000 ]; then bad "--dirs must be 1..100000"; fi
[ "$ROUNDS" -ge 1 ] || bad "--rounds must be at least 1"
[ "$BUILD_SOURCES" -le 99999 ] || bad "--build must be 0..99999"
[ "$MEM" -ge 512 ] || bad "--mem must be at least 512 (MiB)"
[ "$SMP" -ge 1 ] || bad "--smp must be at least 1"
case "$KERNEL" in 6.12-generic|6.12|6.1) ;; *) bad "--kernel must be 6.12-generic, 6.12 or 6.1" ;; esac
case "$ACCEL" in auto|tcg|kvm) ;; *) bad "--accel must be auto, tcg or kvm" ;; esac
[ "$CACHE_MODES" = all ] && CACHE_MODES="never,metadata,auto,always"
MODES=()
for m in ${CACHE_MODES//,/ }; do
    case "$m" in never|metadata|auto|always) MODES+=("$m") ;; *) bad "--cache takes never, metadata, auto, always (comma-separated) or all" ;; esac
done
[ "${#MODES[@]}" -gt 0 ] || bad "--cache is empty"
[[ "$QUEUES" =~ ^[1-9][0-9]*$ ]] || bad "QUEUES must be a positive number"
COLS=()
for c in ${COLUMNS//,/ }; do
    case "$c" in ours|ref|9p|tmpfs|nolocks) COLS+=("$c") ;; *) bad "--columns takes ours, ref, 9p, tmpfs, nolocks (comma-separated)" ;; esac
done
[ "${#COLS[@]}" -gt 0 ] || bad "--columns is empty"
[[ "$NINEP_OPTS" =~ ^[A-Za-z0-9_.=,]+$ ]] || bad "NINEP_OPTS must be a comma-separated list of mount options"
case "$TREE" in /*) ;; *) bad "--tree must be an absolute path" ;; esac
case "$TREE" in /|/usr|/usr/*|/etc|/etc/*|/bin|/bin/*|/home|/root|/var|/var/tmp|/tmp) bad "--tree $TREE: pick a dedicated directory (it is deleted and regenerated)" ;; esac
if [ "$(id -u)" -ne 0 ]; then
    echo "guest.sh: must run as root (both daemons serve the tree as root; the reference sandboxes itself in namespaces)" >&2
    exit 2
fi
has_col() { [[ " ${COLS[*]} " = *" $1 "* ]]; }
if has_col 9p && [ "$KERNEL" != 6.12-generic ]; then
    bad "the 9p column needs --kernel 6.12-generic (the cloud kernels have no 9p); or drop it from --columns"
fi

START=$SECONDS
mkdir -p "$OUT"
# one run at a time: they would share the logs, the tree and the host's CPUs
exec 9>"$OUT/.lock"
if ! flock -n 9; then
    echo "guest.sh: another guest.sh is running (it holds $OUT/.lock)" >&2
    exit 1
fi
work_dir virtiofsd-guest-bench
trap 'printf "\nguest.sh: interrupted\n" >&2; exit 130' INT TERM HUP

die() { echo "guest.sh: $*" >&2; exit 1; }
say() { echo "# $*" >&2; }

# --- prerequisites -----------------------------------------------------------------------------
if [ -n "$(kit_missing "$KERNEL" /usr/bin/gcc /usr/bin/tcc /usr/bin/make /usr/bin/git /bin/busybox)" ]; then
    say "running tests/guest/install.sh (log: $OUT/install.log)"
    install_kit "$OUT/install.log" "$KERNEL" ||
        die "tests/guest/install.sh failed; tail of $OUT/install.log:
$(tail -n 20 "$OUT/install.log")"
fi
GUEST_TOOLS=(/usr/bin/find /usr/bin/ls /usr/bin/du /usr/bin/tar /usr/bin/grep /usr/bin/wc /usr/bin/make /usr/bin/tcc /usr/bin/git)
for b in "${GUEST_TOOLS[@]}"; do
    [ -x "$b" ] || die "$b is missing on the host (GNU findutils, coreutils, tar, grep, make, tcc and git go into the guest)"
done

if has_col ours || has_col nolocks; then
    if [ "$BUILD" = 1 ]; then
        say "cargo build --release --bin virtiofsd (log: $OUT/build.log)"
        build_daemon "$OUT/build.log" || die "cargo build failed; see $OUT/build.log:
$(grep -E '^error' -A5 "$OUT/build.log" | head -n 30)"
    fi
    DAEMON="${DAEMON:-$(target_dir)/release/virtiofsd}"
    [ -x "$DAEMON" ] || die "$DAEMON is missing or not executable"
fi
# --requests: the daemons log every request (the log is cut into steps at the guest's FSYNCDIR)
if [ "$REQUESTS" = 1 ]; then
    OURS_EXTRA+=(--log-level=debug)
    REF_EXTRA+=(--log-level=debug)
fi
REF="$REF_ROOT/bin/virtiofsd"
if has_col ref; then
    ensure_reference >"$OUT/reference-install.log" 2>&1 ||
        die "installing the reference failed; see $OUT/reference-install.log"
    [ -x "$REF" ] || die "$REF is missing"
fi

gcc -static -O2 -Wall -o "$WORK/benchtool" "$HERE/in-guest/benchtool.c" 2>"$WORK/benchtool.err" ||
    die "compiling tests/bench/in-guest/benchtool.c failed:
$(cat "$WORK/benchtool.err")"

# --- the tree ----------------------------------------------------------------------------------
say "generating the tree in $TREE: $FILES files in $DIRS directories (seed $SEED)"
rm -rf "$TREE"
mkdir -p "$(dirname "$TREE")"
TREE_INFO="$("$WORK/benchtool" mktree "$TREE" "$FILES" "$DIRS" "$SEED")" || die "generating the tree failed"
say "tree: $TREE_INFO"
tree_field() { printf '%s\n' "$TREE_INFO" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# What each step must print (the same GNU tools on the host; du depends on the file system).
# This also reads the whole tree, so the host's page cache holds it for every boot. The tmpfs
# column's tree has no git repository: its wants are taken before the repository is made.
declare -A WANT BARE_WANT
host_out() { (cd "$TREE" && bash -c "set -o pipefail; $1") 2>/dev/null | tr '\n' ' '; }
tree_wants() {
WANT[find-cold]="$(host_out '/usr/bin/find . | /usr/bin/wc -l')"
WANT[find-warm]="${WANT[find-cold]}"
WANT[find-hot]="${WANT[find-cold]}"
WANT[stat-rtt]=""
WANT[find-type-f]="$(host_out '/usr/bin/find . -type f | /usr/bin/wc -l')"
WANT[ls-lR]="$(host_out '/usr/bin/ls -lR | /usr/bin/wc -l')"
WANT[tar-cold]="$(host_out '/usr/bin/tar cf - . | /usr/bin/wc -c')"
WANT[tar-warm]="${WANT[tar-cold]}"
WANT[grep-r]="$(host_out '/usr/bin/grep -r virtiofsd-guest-bench-needle . | /usr/bin/wc -l')"
WANT[create-rm]=""
WANT[read-cold]="$("$WORK/benchtool" readtree "$TREE") "
WANT[stat-after-read]="$("$WORK/benchtool" lstattree "$TREE") "
WANT[stat-warm]="${WANT[stat-after-read]}"
}
tree_wants
[ "${WANT[find-type-f]}" = "$(tree_field files) " ] ||
    die "host check: find -type f counted '${WANT[find-type-f]}', the generator made $(tree_field files)"
[ "${WANT[grep-r]}" = "$(tree_field needles) " ] ||
    die "host check: grep -r counted '${WANT[grep-r]}', the generator wrote $(tree_field needles) needles"
for k in "${!WANT[@]}"; do BARE_WANT[$k]="${WANT[$k]}"; done
say "making the tree a git repository (objects packed)"
(cd "$TREE" && git init -q --template= && git config gc.auto 0 && git add -A &&
    git -c user.name=bench -c user.email=bench@localhost commit -q -m tree &&
    git gc -q --prune=now) >"$OUT/git.log" 2>&1 || die "git failed on the tree; see $OUT/git.log"
tree_wants
WANT[git-status]="$(host_out '/usr/bin/git status --porcelain | /usr/bin/wc -l')"
[ "${WANT[git-status]}" = "0 " ] || die "host check: git status found ${WANT[git-status]}changes in the tree just committed"
STEPS=(find-cold find-warm find-hot stat-rtt find-type-f ls-lR du-s tar-cold tar-warm grep-r git-status
       create-rm read-cold stat-after-read stat-warm)

# The build steps' project: made here once with the same generator and built with the same
# make and tcc, for what each build step must print (objects built, bytes of objects, objects
# left after clean). The guest makes its own copy in every boot (the host checks its #PROJ line).
PROJ_INFO=""
if [ "$BUILD_SOURCES" -gt 0 ]; then
    PROJ="$WORK/proj"
    PROJ_INFO="$("$WORK/benchtool" mkproj "$PROJ" "$BUILD_SOURCES" "$SEED")" || die "generating the project failed"
    say "project: $PROJ_INFO"
    # the five sources build-incr touches (as tests/bench/in-guest/init picks them)
    TOUCHED=()
    for i in 0 1 2 3 4; do
        c=$(( (i * (BUILD_SOURCES / 5) + i) % BUILD_SOURCES ))
        TOUCHED+=("$(printf 'src/m%d/c%04d.c' $((c % 8)) "$c")")
    done
    proj_out() { (cd "$PROJ" && bash -c "set -o pipefail; $1") 2>/dev/null | tr '\n' ' '; }
    built='/usr/bin/awk '\''/^\/usr\/bin\/tcc /{n++} END{print n+0}'\'''
    WANT[build-cold]="$(proj_out "/usr/bin/make -j2 | $built")"
    WANT[build-noop]="$(proj_out "/usr/bin/make -j2 | $built")"
    WANT[build-incr]="$(proj_out "touch ${TOUCHED[*]} && /usr/bin/make -j2 | $built")"
    cc="/usr/bin/tcc -nostdinc -Iinc/i0 -Iinc/i1 -Iinc/i2 -Iinc/i3 -Iinc/i4 -Iinc/i5 -c src/m1/c0001.c"
    WANT[cc-one-new]="$(proj_out "$cc -o one.o && wc -c < one.o")"
    WANT[cc-one-over]="${WANT[cc-one-new]}"
    rm -f "$PROJ/one.o"
    WANT[objs-read]="$(proj_out 'cat src/*/*.o | wc -c')"
    WANT[clean]="$(proj_out "/usr/bin/make clean > /dev/null && /usr/bin/find src -name '*.[od]' | wc -l")"
    [ "${WANT[build-cold]}" = "$BUILD_SOURCES " ] ||
        die "host check: make built '${WANT[build-cold]}' objects, the project has $BUILD_SOURCES sources"
    if [ "${WANT[build-noop]}" != "0 " ] || [ "${WANT[build-incr]}" != "5 " ] || [ "${WANT[clean]}" != "0 " ]; then
        die "host check: the project's make printed noop '${WANT[build-noop]}', incr '${WANT[build-incr]}', clean '${WANT[clean]}' (want 0, 5, 0)"
    fi
    rm -rf "$PROJ"
    STEPS+=(build-cold build-noop build-incr)
    [ "$REQUESTS" = 1 ] && STEPS+=(cc-one-new cc-one-over)
    STEPS+=(objs-read clean)
fi
# diagnostics: shown, but not steps a user runs (left out of the "no step slower" check)
DIAGNOSTIC_STEPS="stat-rtt cc-one-new cc-one-over"
# the project's wants hold for the tmpfs column too
for k in "${!WANT[@]}"; do
    [ -n "${BARE_WANT[$k]+set}" ] || [ "$k" = git-status ] || BARE_WANT[$k]="${WANT[$k]}"
done

# --- initramfs ---------------------------------------------------------------------------------
ST="$WORK/initramfs"
initramfs_skeleton "$ST"
mkdir -p "$ST/helpers"
cp "$HERE/in-guest/init" "$ST/init"
chmod 755 "$ST/init"
cp "$WORK/benchtool" "$ST/helpers/"
initramfs_modules "$ST" "$CACHE/kernel-$KERNEL"
initramfs_binaries "$ST" "${GUEST_TOOLS[@]}" ||
    die "copying the GNU tools, make and tcc into the initramfs failed"
initramfs_pack "$ST" "$WORK/initramfs.cpio" || die "packing the initramfs failed"
choose_accel "$ACCEL" qemu-system-x86_64 "$CACHE/kernel-$KERNEL/vmlinuz" "$WORK/initramfs.cpio" \
    bench_fs=probe '#GUEST kernel=' "$WORK/probe.log"
[ -z "$ACCEL_NOTE" ] || say "--accel auto: $ACCEL_NOTE; using TCG"
ACCEL="${ACCEL_ARGS[1]}"   # tcg or kvm, for the report

# --- boots -------------------------------------------------------------------------------------
TIMES="$OUT/times.tsv"
printf 'round\tmode\tcolumn\tstep\tseconds\n' > "$TIMES"
rm -f "$OUT/requests.tsv" "$OUT/requests.md"
FAILED=0
GUEST_KERNEL=""
rm -rf "$OUT"/r[0-9]*-* "$OUT"/{never,metadata,auto,always}-r[0-9]*-*

# bad_boot MSG: a failure of the current boot (reported, counted; the run goes on)
bad_boot() { echo "FAILED: $*" >&2; FAILED=$((FAILED + 1)); }

show_time() { printf ' %s' "$1" >&2; }

# boot ROUND COLUMN: one boot of COLUMN with --cache=$CACHE_MODE
boot() {
    local r="$1" col="$2" logs="$OUT/$CACHE_MODE-r$1-$2" sock="$WORK/vfs.sock" dpid="" flags=()
    local wants=WANT
    [ "$col" = tmpfs ] && wants=BARE_WANT
    local -n want="$wants"
    mkdir -p "$logs"
    local append="bench_churn=$CHURN bench_build=$BUILD_SOURCES,$SEED bench_wait=$WAIT"
    [ "$REQUESTS" = 1 ] && append+=" bench_marks=1"
    local dev=()
    if [ "$col" != tmpfs ]; then
        # the host's tree: no leftovers, and the host's page cache warm for every column alike
        rm -rf "$TREE/.bench-churn" "$TREE/.bench-build"
        (cd "$TREE" && /usr/bin/tar cf - . | /usr/bin/wc -c) >/dev/null 2>&1
    fi
    if [ "$col" = tmpfs ]; then
        append+=" bench_fs=tmpfs bench_tree=$FILES,$DIRS,$SEED"
    elif [ "$col" = 9p ]; then
        append+=" bench_fs=9p bench_9p_opts=$NINEP_OPTS"
        # QEMU serves the tree itself (as root, like the daemons)
        dev=(-fsdev "local,id=fs9p,path=$TREE,security_model=passthrough"
             -device "virtio-9p-pci,fsdev=fs9p,mount_tag=share")
    else
        append+=" bench_fs=virtiofs"
        # (start_daemon runs $DAEMON: here the column's)
        local DAEMON="$DAEMON"
        case "$col" in
            ours) flags=("${OURS_EXTRA[@]}") ;;
            nolocks) flags=("${OURS_EXTRA[@]}" --posix-lock=off --flock=off) ;;
            *) DAEMON="$REF"; flags=("${REF_EXTRA[@]}") ;;
        esac
        rm -f "$sock"
        echo "$DAEMON --socket-path $sock --shared-dir $TREE --cache=$CACHE_MODE ${flags[*]}" > "$logs/daemon.cmd"
        start_daemon "$sock" "$TREE" "$logs/daemon.log" "--cache=$CACHE_MODE" "${flags[@]}"
        dpid=$DPID
        if ! wait_socket "$sock" "$dpid"; then
            bad_boot "round $r, $col: the daemon did not create its socket within 10 s; $logs/daemon.log:
$(tail -n 10 "$logs/daemon.log")"
            reap "$dpid" 0
            return
        fi
        dev=(-chardev "socket,id=vfs,path=$sock"
             -device "vhost-user-fs-pci,chardev=vfs,tag=share,num-request-queues=$QUEUES")
    fi

    local t0=$SECONDS
    start_guest "$logs/console.log" "$logs/qemu.log" "$CACHE/kernel-$KERNEL/vmlinuz" \
        "$WORK/initramfs.cpio" "${MEM}M" "$append" -smp "$SMP" "${dev[@]}"
    # wait for the guest to power off, showing each step's time as it comes
    printf '# round %s/%s %s:' "$r" "$ROUNDS" "$col" >&2
    watch_guest "$TIMEOUT" show_time "$logs/console.log" 's/^#TIME \([^ ]*\) \([0-9.]*\)$/\1=\2/p'
    local qrc="$QRC" timed_out=0
    [ "$qrc" = timeout ] && timed_out=1
    local secs=$((SECONDS - t0))

    if [ -n "$dpid" ]; then
        reap "$dpid" 10
        [ "$REAPED" = running ] &&
            echo "# the daemon was still running 10 s after QEMU exited; killed" >> "$logs/daemon.log"
    fi

    local c="$logs/console.log" line
    touch "$c"
    tr -d '\r' < "$c" > "$logs/console.txt"
    c="$logs/console.txt"
    [ -n "$GUEST_KERNEL" ] || GUEST_KERNEL="$(sed -n 's/^#GUEST kernel=\([^ ]*\).*/\1/p' "$c" | head -n 1)"
    while IFS= read -r line; do
        local step="${line#\#TIME }"; step="${step%% *}"
        local t="${line##* }"
        [[ "$t" =~ ^[0-9]+\.[0-9]+$ ]] || continue
        printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$CACHE_MODE" "$col" "$step" "$t" >> "$TIMES"
    done < <(grep '^#TIME ' "$c")
    echo " (boot ${secs}s)" >&2

    if [ "$timed_out" = 1 ]; then
        bad_boot "round $r, $col: guest still running after ${TIMEOUT}s (killed); console tail:
$(tail -n 5 "$c")"
    elif ! grep -q '^#DONE' "$c"; then
        bad_boot "round $r, $col: the guest did not finish (QEMU exit status $qrc); console tail:
$(tail -n 10 "$c")
QEMU log: $(tail -n 5 "$logs/qemu.log")"
    fi
    if grep -q 'rcu.*detected stalls' "$c"; then
        echo "note: round $r, $col: the guest kernel reported RCU stalls (its vCPUs were starved: the host is overloaded; the times of this boot are not worth much)" >&2
    fi
    grep '^#BAIL\|^#FAIL' "$c" | while IFS= read -r line; do echo "FAILED: round $r, $col: ${line#\#}" >&2; done
    FAILED=$((FAILED + $(grep -c '^#BAIL\|^#FAIL' "$c")))
    # the output of each step must be what the host's GNU tools printed for the same tree
    local s got
    for s in "${STEPS[@]}"; do
        [ -n "${want[$s]:-}" ] || continue
        grep -q "^#TIME $s " "$c" || continue
        got="$(sed -n "s/^#OUT $s //p" "$c" | head -n 1)"
        if [ "$got" != "${want[$s]}" ]; then
            bad_boot "round $r, $col: step $s printed '$got', the host's tools '${want[$s]}' on the same tree"
        fi
    done
    if [ "$col" = tmpfs ] && grep -q '^#TIME ' "$c"; then
        got="$(sed -n 's/^#TREE //p' "$c")"
        [ "$got" = "$TREE_INFO" ] || bad_boot "round $r, tmpfs: the guest made the tree '$got', the host '$TREE_INFO'"
    fi
    if [ "$BUILD_SOURCES" -gt 0 ] && grep -q '^#TIME build-cold ' "$c"; then
        got="$(sed -n 's/^#PROJ //p' "$c")"
        [ "$got" = "$PROJ_INFO" ] || bad_boot "round $r, $col: the guest made the project '$got', the host '$PROJ_INFO'"
    fi
    if [ "$col" != tmpfs ]; then
        for line in .bench-churn .bench-build; do
            [ -e "$TREE/$line" ] && bad_boot "round $r, $col: $TREE/$line is still there after the boot"
        done
    fi
    if [ "$REQUESTS" = 1 ] && [ "$col" != 9p ] && [ "$col" != tmpfs ]; then
        count_requests "$r" "$col" "$logs"
    fi
}

# count_requests ROUND COLUMN LOGS: the requests of each step in the daemon's debug log, cut at
# the FSYNCDIR (opcode 30) the guest makes before and after each step ("#MARK NAME" on the
# console, in the same order); one line per step in $OUT/requests.tsv. Ours logs
# "request unique=U opcode=NAME ..." (the number of an opcode it does not know), the
# reference "Received request: opcode=Name (N), ...".
count_requests() {
    local marks
    marks="$(sed -n 's/^#MARK \([A-Za-z0-9_-]*\)$/\1/p' "$3/console.txt" | tr '\n' ' ')"
    awk -v r="$1" -v mode="$CACHE_MODE" -v col="$2" -v marks="$marks" '
        BEGIN {
            nm = split(marks, M, " ")
            split("LOOKUP FORGET GETATTR SETATTR READLINK SYMLINK - MKNOD MKDIR UNLINK RMDIR RENAME LINK OPEN READ WRITE STATFS RELEASE - FSYNC SETXATTR GETXATTR LISTXATTR REMOVEXATTR FLUSH INIT OPENDIR READDIR RELEASEDIR FSYNCDIR GETLK SETLK SETLKW ACCESS CREATE INTERRUPT BMAP DESTROY IOCTL POLL NOTIFY_REPLY BATCH_FORGET FALLOCATE READDIRPLUS RENAME2 LSEEK COPY_FILE_RANGE SETUPMAPPING REMOVEMAPPING SYNCFS TMPFILE STATX", N, " ")
            k = 0   # marks passed
        }
        /request unique=[0-9]+ opcode=[A-Z0-9_]+ |Received request: opcode=[A-Za-z]+ \([0-9]+\)/ {
            if (match($0, /opcode=[A-Za-z]+ \([0-9]+\)/)) {
                s = substr($0, RSTART, RLENGTH); sub(/.*\(/, "", s); op = s + 0
                name = (op in N && N[op] != "-") ? N[op] : "op" op
            } else {
                match($0, /opcode=[A-Z0-9_]+ /); name = substr($0, RSTART + 7, RLENGTH - 8)
                if (name ~ /^[0-9]+$/) name = "op" name
            }
            if (name == "FSYNCDIR" && k < nm) { k++; next }
            if (k % 2 == 1) {   # inside step M[k]
                c[k, name]++; t[k]++; seen[k] = 1
                if (!(name in known)) { known[name] = 1; names[++nn] = name }
            }
        }
        END {
            for (i = 1; i <= nm; i += 2) {
                line = ""
                for (j = 1; j <= nn; j++) if (c[i, names[j]]) line = line " " names[j] "=" c[i, names[j]]
                printf "%s\t%s\t%s\t%s\t%d\t%s\n", mode, col, r, M[i], t[i] + 0, substr(line, 2)
            }
        }' "$3/daemon.log" >> "$OUT/requests.tsv"
}

say "logs in $OUT; modes ${MODES[*]}; columns ${COLS[*]}; $ROUNDS round(s); guest: Linux $KERNEL, ${ACCEL}, ${SMP} CPUs, ${MEM} MiB"
for CACHE_MODE in "${MODES[@]}"; do
    for r in $(seq 1 "$ROUNDS"); do
        for col in "${COLS[@]}"; do
            printf '# %s ' "$CACHE_MODE" >&2
            boot "$r" "$col"
        done
    done
done

# --- report ------------------------------------------------------------------------------------
cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
mem_gib="$(awk '/^MemTotal:/ { printf "%d", $2 / 1048576 + 0.5 }' /proc/meminfo)"
qver="$(qemu-system-x86_64 --version | sed -n '1s/^QEMU emulator version //p')"
MACHINE="Machine: ${cpu:-unknown CPU}, $(nproc) cores, ${mem_gib} GiB, host Linux $(uname -r); guest Linux ${GUEST_KERNEL:-?} (${ACCEL}, ${SMP} CPUs, ${MEM} MiB); QEMU ${qver}; $(date -u '+%Y-%m-%d %H:%M UTC')"
SETUP="Tree: $FILES files of 0-4 KiB in $DIRS directories ($(tree_field dirs) with their parents, $(tree_field bytes) bytes); --wait $WAIT; ours: ${OURS_EXTRA[*]:-(defaults)}; ref: ${REF_EXTRA[*]:-(defaults)}; 9p: -o $NINEP_OPTS; $QUEUES request queue(s); create-rm: $CHURN files; build: ${PROJ_INFO:-none}; medians of $ROUNDS round(s)"

{
    echo "$MACHINE"
    echo "$SETUP"
    for CACHE_MODE in "${MODES[@]}"; do
    echo
    echo "--cache=$CACHE_MODE (both daemons):"
    echo
    awk -F'\t' -v steps="${STEPS[*]}" -v diag="$DIAGNOSTIC_STEPS" -v mode="$CACHE_MODE" '
        NR > 1 && $2 == mode { v[$3, $4] = v[$3, $4] " " $5 }
        function median(s,    a, n, i, j, t) {
            n = split(s, a, " ")
            if (n == 0) return ""
            for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
            return n % 2 ? a[(n + 1) / 2] + 0 : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        function fmt(x) { return x == "" ? "-" : sprintf("%.2f", x) }
        function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "-" : sprintf("%.2f", a / b) }
        END {
            n = split(steps, st, " ")
            split(diag, dl, " "); for (i in dl) D[dl[i]] = 1
            print "| step | ours s | ref s | 9p s | tmpfs s | ours/ref speedup | ours/9p speedup | ours/tmpfs |"
            print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            for (i = 1; i <= n; i++) {
                o = median(v["ours", st[i]]); r = median(v["ref", st[i]]); t = median(v["tmpfs", st[i]])
                p = median(v["9p", st[i]])
                O[st[i]] = o; R[st[i]] = r; T[st[i]] = t; P[st[i]] = p
                printf "| %s%s | %s | %s | %s | %s | %s | %s | %s |\n", st[i], (st[i] in D) ? " (diagnostic)" : "", fmt(o), fmt(r), fmt(p), fmt(t), ratio(r, o), ratio(p, o), ratio(o, t)
                L[st[i]] = median(v["nolocks", st[i]]); if (L[st[i]] != "") nl = 1
            }
            print ""
            if (nl) {
                print "ours with --posix-lock=off --flock=off added (nolocks) beside ours:"
                print ""
                print "| step | ours s | nolocks s | ours/nolocks |"
                print "| --- | ---: | ---: | ---: |"
                for (i = 1; i <= n; i++)
                    printf "| %s%s | %s | %s | %s |\n", st[i], (st[i] in D) ? " (diagnostic)" : "", fmt(O[st[i]]), fmt(L[st[i]]), ratio(O[st[i]], L[st[i]])
                print ""
            }
            if (mode == "auto") {
                print "Targets (issue 22, --cache=auto):"
                target("warm tar read >= 2x faster than ref", ratio(R["tar-warm"], O["tar-warm"]), ">=", 2, "speedup")
                target("warm grep -r >= 2x faster than ref", ratio(R["grep-r"], O["grep-r"]), ">=", 2, "speedup")
                target("git status after the timeout >= 2x faster than ref", ratio(R["git-status"], O["git-status"]), ">=", 2, "speedup")
                slower("ref", R, "- no step slower than ref: ")
            } else if (mode != "always") {
                print "Targets (issue 22, --cache=" mode "):"
                slower("ref", R, "- no step slower than ref: ")
            } else always_targets()
        }
        function always_targets() {
            print "Targets (issue 8, --cache=always):"
            target("warm tar read <= 2x tmpfs", ratio(O["tar-warm"], T["tar-warm"]), "<=", 2, "ours/tmpfs")
            target("warm find <= 1.5x tmpfs", ratio(O["find-warm"], T["find-warm"]), "<=", 1.5, "ours/tmpfs")
            target("cold find >= 1.3x faster than ref", ratio(R["find-cold"], O["find-cold"]), ">=", 1.3, "speedup")
            target("cold tar read >= 1.3x faster than ref", ratio(R["tar-cold"], O["tar-cold"]), ">=", 1.3, "speedup")
            if ("build-cold" in O) {
                print ""
                print "Targets (issue 14, --cache=always):"
                target("cold build <= 1.5x tmpfs", ratio(O["build-cold"], T["build-cold"]), "<=", 1.5, "ours/tmpfs")
                target("cold build >= 2x faster than ref", ratio(R["build-cold"], O["build-cold"]), ">=", 2, "speedup")
                target("cold build >= 2x faster than 9p", ratio(P["build-cold"], O["build-cold"]), ">=", 2, "speedup")
                target("no-op build <= 2x tmpfs", ratio(O["build-noop"], T["build-noop"]), "<=", 2, "ours/tmpfs")
                target("incremental build <= 2x tmpfs", ratio(O["build-incr"], T["build-incr"]), "<=", 2, "ours/tmpfs")
            }
            slower("ref", R, "- no step slower than ref: ")
            slower("9p", P, "- (not a target) steps slower than 9p: ")
        }
        function slower(name, X, label,    i, q, slow, have) {
            slow = ""; have = 0
            for (i = 1; i <= n; i++) {
                if (st[i] in D) continue
                q = ratio(X[st[i]], O[st[i]]); if (q == "-") continue
                have = 1; if (q + 0 < 1) slow = slow " " st[i] " (" q ")"
            }
            if (name == "ref") {
                if (!have) print label "- (no data)"
                else if (slow == "") print label "met"
                else print label "NOT met:" slow
            } else if (have) print label (slow == "" ? "none" : slow)
        }
        function target(name, q, op, lim, what) {
            if (q == "-") { print "- " name ": - (no data)"; return }
            ok = (op == "<=") ? (q + 0 <= lim) : (q + 0 >= lim)
            print "- " name ": " (ok ? "met" : "NOT met") " (" what " " q ")"
        }' "$TIMES"
    done
} > "$OUT/result.md"
cat "$OUT/result.md"
if [ -s "$OUT/requests.tsv" ]; then
    {
        echo
        echo "Requests per step, from each daemon's debug log (FORGETs of a drop_caches may fall into the step after it); the medians over the rounds, by opcode from the first round:"
        for CACHE_MODE in "${MODES[@]}"; do
            echo
            echo "--cache=$CACHE_MODE:"
            echo
            echo "| step | ours | ref | ours/ref | ours by opcode | ref by opcode |"
            echo "| --- | ---: | ---: | ---: | --- | --- |"
            awk -F'\t' -v mode="$CACHE_MODE" -v steps="${STEPS[*]}" '
                function median(s,    a, n, i, j, t) {
                    n = split(s, a, " ")
                    if (n == 0) return ""
                    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
                    return n % 2 ? a[(n + 1) / 2] + 0 : (a[n / 2] + a[n / 2 + 1]) / 2
                }
                $1 == mode { c[$2, $4] = c[$2, $4] " " $5; if (!(($2, $4) in b)) b[$2, $4] = $6 }
                END {
                    n = split(steps, st, " ")
                    more = ""
                    for (i = 1; i <= n; i++) {
                        o = median(c["ours", st[i]]); r = median(c["ref", st[i]])
                        if (o == "" && r == "") continue
                        q = (o == "" || r == "" || r + 0 == 0) ? "-" : sprintf("%.2f", o / r)
                        if (q != "-" && o + 0 > r + 0) more = more " " st[i]
                        printf "| %s | %s | %s | %s | %s | %s |\n", st[i], o == "" ? "-" : o, r == "" ? "-" : r, q, b["ours", st[i]], b["ref", st[i]]
                    }
                    print ""
                    print "- no step with more requests than ref: " (more == "" ? "met" : "NOT met:" more)
                    nl = 0
                    for (i = 1; i <= n; i++) if (c["nolocks", st[i]] != "") nl = 1
                    if (!nl) exit
                    print ""
                    print "ours with --posix-lock=off --flock=off added (nolocks) beside ours:"
                    print ""
                    print "| step | ours | nolocks | nolocks by opcode |"
                    print "| --- | ---: | ---: | --- |"
                    for (i = 1; i <= n; i++) {
                        o = median(c["ours", st[i]]); l = median(c["nolocks", st[i]])
                        if (o == "" && l == "") continue
                        printf "| %s | %s | %s | %s |\n", st[i], o == "" ? "-" : o, l == "" ? "-" : l, b["nolocks", st[i]]
                    }
                }' "$OUT/requests.tsv"
        done
    } > "$OUT/requests.md"
    cat "$OUT/requests.md"
fi
echo
echo "(table saved in $OUT/result.md; raw times in $TIMES; took $((SECONDS - START)) s)"
if [ "$FAILED" -gt 0 ]; then
    echo "guest.sh: $FAILED failure(s) above; the numbers of those boots are incomplete or suspect" >&2
    exit 1
fi
exit 0
