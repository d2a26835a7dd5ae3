#!/usr/bin/env bash
# Live migration with real QEMUs: two QEMU processes on this machine (TCG), a daemon each over
# the same host directory, the destination started with -incoming, `migrate` through QMP.
# The guest (suite-migrate.sh) holds files open for reading and writing, a directory handle in
# the middle of a listing, its working directory in the share and a cached tree; it reads an
# 8 MiB file in a loop during the migration (page cache dropped, so each read is served by a
# daemon into guest memory: the dirty log must carry those pages to the destination). After
# the switch-over, on the destination, it goes on with all of them and makes new files; the
# host checks every byte. A guest process holds a flock and a fcntl lock on files of the share
# across the migration and goes on running on the destination: the host cannot take them once
# the source daemon is gone, and can once the guest let them go. Runs, each a fresh pair of
# daemons and VMs:
#   find-paths   --cache=auto    --migration-on-error=guest-error  (a held file deleted on the
#                                 host before the switch-over: an error on that file only)
#   find-paths   --cache=always  --migration-on-error=guest-error  (the same)
#   file-handles --cache=auto    --migration-on-error=abort
#   file-handles --cache=always  --migration-on-error=abort
#
# Usage: tests/guest/migrate.sh [options]
#   --kernel 6.12|6.1  guest kernel (default 6.12)
#   --only N           only run N (1 to 4, in the order above)
#   --daemon PATH      test this binary instead of building target/release/virtiofsd
#   --no-build         do not run cargo build (use the existing target/release/virtiofsd)
#   --keep             keep the work dir
#   -v, --verbose      also print the diagnostics of passing tests
# Prints "ok N name" / "not ok N name" lines and "N passed, N failed"; exits non-zero when a
# check failed. Logs (consoles, daemons, QEMUs) in target/guest-tests/migrate-*. Needs root; runs
# tests/guest/install.sh when QEMU, busybox or the guest kernel is missing.
set -uo pipefail

# shellcheck source=tests/lib/common.sh
. "$(dirname "$0")/../lib/common.sh"
OUT="$ROOT/target/guest-tests"
KERNEL=6.12
ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --kernel) KERNEL="$2"; shift 2 ;;
        --kernel=*) KERNEL="${1#*=}"; shift ;;
        --only) ONLY="$2"; shift 2 ;;
        --only=*) ONLY="${1#*=}"; shift ;;
        *) common_option "$@" || bad_usage "unknown option $1"; shift "$TAKEN" ;;
    esac
done
case "$KERNEL" in 6.12|6.1) ;; *) bad_usage "--kernel must be 6.12 or 6.1" ;; esac
case "$ONLY" in ""|[1-4]) ;; *) bad_usage "--only takes a run's number, 1 to 4" ;; esac
need_root "the daemons create files as the guest's callers; the shares are tmpfs mounts"
mkdir -p "$OUT"
# QEMU, busybox and the guest kernel: installed on first use, as run.sh does.
ensure_kit "$OUT/migrate-install.log" "$KERNEL"
work_dir virtiofsd-migrate /tmp
MOUNTS=()
unmount_all() {
    local m
    for m in "${MOUNTS[@]}"; do umount -l "$m" 2>/dev/null; done
}
at_exit unmount_all

prepare_daemon "$OUT/migrate-build.log"

# The initramfs: busybox, /init, the suites, the dirhold helper.
build_helpers "$WORK/helpers" dirhold locks
kit_initramfs "$WORK/initramfs.cpio" "$KERNEL" "$WORK/helpers"

# Both QEMUs run under TCG (as doc/migration.md says); there is no --accel here.
choose_accel tcg

# qmp SOCKET COMMAND [ARGS-JSON]: one QMP command; prints its "return" as JSON.
qmp() {
    python3 - "$@" <<'PY'
import json, socket, sys
path, cmd = sys.argv[1], sys.argv[2]
args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(path)
f = s.makefile("rw")
def recv():
    while True:
        m = json.loads(f.readline())
        if "event" not in m:
            return m
recv()  # greeting
f.write(json.dumps({"execute": "qmp_capabilities"}) + "\n"); f.flush(); recv()
msg = {"execute": cmd}
if args is not None:
    msg["arguments"] = args
f.write(json.dumps(msg) + "\n"); f.flush()
r = recv()
if "error" in r:
    print(json.dumps(r["error"])); sys.exit(1)
print(json.dumps(r.get("return")))
PY
}

wait_for() { # FILE PATTERN SECONDS
    local t=0
    while ! grep -q "$2" "$1" 2>/dev/null; do
        sleep 0.5; t=$((t + 1)); [ $t -ge $(($3 * 2)) ] && return 1
    done
    return 0
}

pair_daemon() { # NAME SHARE FLAGS...: the daemon NAME (src, dst) on $DIR/NAME.sock, listening; DPID
    local name="$1" share="$2"; shift 2
    start_daemon "$DIR/$name.sock" "$share" "$LOGS/daemon-$name.log" "$@"
    wait_socket "$DIR/$name.sock" "$DPID"
}

pair_qemu() { # NAME EXTRA...: the QEMU NAME (src, dst), its QMP on $DIR/qmp-NAME.sock; QPID
    local name="$1"; shift
    start_guest "$LOGS/console-$name.log" "$LOGS/qemu-$name.log" "$CACHE/kernel-$KERNEL/vmlinuz" \
        "$WORK/initramfs.cpio" 512M \
        "init_on_alloc=0 init_on_free=0 guest_suite=migrate guest_migrate_error=$GUEST_ERROR" \
        -smp 2 -chardev "socket,id=vfs,path=$DIR/$name.sock" \
        -device vhost-user-fs-pci,chardev=vfs,tag=share,num-request-queues=2 \
        -qmp "unix:$DIR/qmp-$name.sock,server=on,wait=off" "$@"
}

# one RUN_INDEX MODE CACHE ON_ERROR
one() {
    local idx="$1" mode="$2" cache="$3" onerr="$4"
    local name="$mode/$cache/$onerr" p="[$mode $cache $onerr] "
    DIR="$WORK/run$idx"; LOGS="$OUT/migrate-$idx-$mode-$cache"
    rm -rf "$LOGS"; mkdir -p "$DIR/share" "$LOGS"
    GUEST_ERROR=0
    [ "$onerr" = guest-error ] && GUEST_ERROR=1
    # A tmpfs of its own: the free-inode count the guest watches changes only by this run.
    mount -t tmpfs -o size=256m,nr_inodes=20000,mode=0755 tmpfs "$DIR/share"; MOUNTS+=("$DIR/share")
    local share="$DIR/share"
    local flags=(--cache "$cache" --migration-mode "$mode" --migration-on-error "$onerr" --log-level info)
    echo "# run $idx: $name"
    local dsrc ddst qsrc qdst
    pair_daemon src "$share" "${flags[@]}"; dsrc=$DPID
    pair_daemon dst "$share" "${flags[@]}"; ddst=$DPID
    pair_qemu src; qsrc=$QPID
    pair_qemu dst -incoming "unix:$DIR/migration.sock"; qdst=$QPID
    if ! wait_for "$LOGS/console-src.log" '^#MARK ready' 240; then
        result fail "${p}guest reached the migration point" "$(tr -d '\r' < "$LOGS/console-src.log" | tail -n 20)"
        return
    fi
    result ok "${p}guest holds files, a directory handle, its cwd and a cached tree"
    [ "$GUEST_ERROR" = 1 ] && rm -f "$share/work/victim"
    local t0=$SECONDS status=""
    # Slow enough that guest memory is copied while the guest's reads keep the daemon writing
    # into it: a page the daemon fills after its copy must be marked in the dirty log.
    qmp "$DIR/qmp-src.sock" migrate-set-parameters '{"max-bandwidth": 16777216}' >"$LOGS/qmp.log" 2>&1
    qmp "$DIR/qmp-src.sock" migrate "{\"uri\": \"unix:$DIR/migration.sock\"}" >>"$LOGS/qmp.log" 2>&1
    local polls=0
    for _ in $(seq 1 240); do
        polls=$((polls + 1))
        # After 6 s of slow copying, let it converge: the guest's reads dirty memory faster
        # than 16 MiB/s.
        [ "$polls" = 12 ] && qmp "$DIR/qmp-src.sock" migrate-set-parameters \
            '{"max-bandwidth": 1073741824, "downtime-limit": 2000}' >>"$LOGS/qmp.log" 2>&1
        status="$(qmp "$DIR/qmp-src.sock" query-migrate 2>>"$LOGS/qmp.log" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("status",""))' 2>/dev/null)"
        case "$status" in completed|failed|cancelled) break ;; esac
        sleep 0.5
    done
    echo "# migration $status after $((SECONDS - t0)) s"
    check "${p}QEMU migrated the guest" "$status" completed
    qmp "$DIR/qmp-src.sock" quit >>"$LOGS/qmp.log" 2>&1
    reap "$qsrc" 30; check "${p}source QEMU quits" "$REAPED" 0
    reap "$dsrc" 15; check "${p}source daemon exits 0 once its QEMU is gone" "$REAPED" 0
    # The source daemon let the guest's locks go as it exited; the destination took them over
    # (it tries every 5 ms): the host cannot take them.
    sleep 1
    local h="$WORK/helpers/locks"
    check "${p}host: the guest's flock is held on the destination" \
        "$("$h" try flock-ex "$share/work/lock-flock" 0 0)" EAGAIN
    check "${p}host: the guest's fcntl lock is held on the destination" \
        "$("$h" try posix-wr "$share/work/lock-posix" 50 10)" EAGAIN
    # The end of the migration, for the guest: 100 files fewer free inodes.
    mkdir -p "$share/.signal"
    local f
    for f in $(seq 1 100); do : > "$share/.signal/$f"; done
    # Once the guest let its locks go, the host takes them (and says so with 50 more files).
    if wait_for "$LOGS/console-dst.log" '^#MARK locks-released' 240; then
        check "${p}host: takes the flock the guest released" \
            "$("$h" try flock-ex "$share/work/lock-flock" 0 0)" ok
        check "${p}host: takes the fcntl lock the guest released" \
            "$("$h" try posix-wr "$share/work/lock-posix" 50 10)" ok
    else
        result fail "${p}guest released its locks" "$(tr -d '\r' < "$LOGS/console-dst.log" | tail -n 20)"
    fi
    for f in $(seq 101 150); do : > "$share/.signal/$f"; done
    reap "$qdst" 300; check "${p}destination guest ran to the end and powered off" "$REAPED" 0
    reap "$ddst" 15; check "${p}destination daemon exits 0" "$REAPED" 0
    local c="$LOGS/console-dst.log"
    # The guest's own results, after the switch-over, from the destination's console.
    report_tap "$c" "${p}guest: "
    grep -q '^#DONE' <(tr -d '\r' < "$c") || result fail "${p}guest finished on the destination" "$(tr -d '\r' < "$c" | tail -n 20)"
    grep -q 'state sent' "$LOGS/daemon-src.log" \
        && result ok "${p}source daemon sent its state" \
        || result fail "${p}source daemon sent its state" "$(tail -n 5 "$LOGS/daemon-src.log")"
    grep -q 'taken over' "$LOGS/daemon-dst.log" \
        && result ok "${p}destination daemon took the state over" \
        || result fail "${p}destination daemon took the state over" "$(tail -n 5 "$LOGS/daemon-dst.log")"
    # The host sees every byte.
    check "${p}host: the held write fd's line" "$(tr '\n' '|' < "$share/work/held-w")" "line 1|line 2 after migration|"
    check "${p}host: file made in the cwd after" "$(cat "$share/work/created-after" 2>&1)" "made in cwd"
    check "${p}host: file made in a new directory after" "$(cat "$share/work/newdir/new.txt" 2>&1)" "new"
    check "${p}host: file removed after" "$([ -e "$share/work/dir/e0" ] && echo present || echo gone)" gone
    check "${p}host: the 8 MiB file" "$(sha256sum "$share/work/big" | cut -d' ' -f1)" \
        "$(data_of "$LOGS/console-src.log" big_sha256)"
    echo "# reads during the migration: $(data_of "$c" reads_during)"
    umount -l "$share" 2>/dev/null
}

report_start "migration tests" "$OUT/migrate-*"
runs=(
    "find-paths auto guest-error"
    "find-paths always guest-error"
    "file-handles auto abort"
    "file-handles always abort"
)
i=0
for r in "${runs[@]}"; do
    i=$((i + 1))
    [ -n "$ONLY" ] && [ "$ONLY" != "$i" ] && continue
    # QEMU under TCG sometimes aborts on an assertion of its own (iotlb_to_section, about one
    # boot in 60 here; not the daemon): such a run is run once more, saying so.
    # A run's results are held until it ends: a run whose QEMU aborted on an assertion of its
    # own is run again instead of reported.
    for try in 1 2; do
        hold_results
        # shellcheck disable=SC2086
        one "$i" $r
        aborted="$(grep -l 'Assertion .* failed' "$LOGS"/qemu-*.log 2>/dev/null | head -n 1)"
        if [ "$try" = 1 ] && [ -n "$aborted" ]; then
            cp "$aborted" "$OUT/migrate-$i.qemu-abort.log"
            echo "# run $i: QEMU aborted ($(grep -h 'Assertion' "$aborted" | head -n 1)); log kept as $OUT/migrate-$i.qemu-abort.log; running it again"
            continue
        fi
        break
    done
    release_results
done
finish
