#!/usr/bin/env bash
# Reliability tests under load and faults (issue 17): a Linux guest under QEMU works on shares
# served by target/release/virtiofsd while the host loads it, fills its file system, kills a
# peer or changes files behind its back; the host then checks what survived. One "ok N name" /
# "not ok N name" line per test and a last line "N passed, N failed"; exits non-zero when a test
# failed. Figures and what each scenario proves: doc/reliability.md.
#
# Usage: tests/guest/reliability.sh [options]
#   --scenario LIST   comma-separated (default: all of them, in this order):
#                       load         stress-ng file-system stressors (--verify) and fio
#                                    (verify=crc32c) on two shares at once, one daemon plain and one
#                                    with --thread-pool-size 4, two request queues each, 2 vCPUs;
#                                    then descriptors and RSS back near idle and every synced byte
#                                    the same on the host (sha256 lists, fio --verify_only)
#                       full         a share on a full ext4 (blocks) and one on an ext4 whose
#                                    inode table is full: ENOSPC, nothing damaged, space reusable
#                       kill-qemu    SIGKILL of QEMU: the daemon exits 0, removes socket and lock
#                       kill-qemu-activated  the same under socket activation (a stand-in for
#                                    systemd holds the socket): the next QEMU gets a new daemon
#                       kill-daemon  SIGKILL of the daemon while the guest writes: every fsync'ed
#                                    file intact; a new daemon on the same socket serves a new VM
#                       host-change  the host replaces, rewrites, creates, renames and deletes
#                                    files under --cache auto, metadata, never and always
#                       fsync        guest fsync/fdatasync/syncfs reach the host (strace), under
#                                    --cache auto, --cache always and --cache always --writeback
#                       reconnect    (not in the default list) a measurement: QEMU's chardev
#                                    reconnect-ms with a restarted daemon; does the guest resume?
#   --long            the long forms (minutes of load instead of seconds; more rounds)
#   --secs N          stress-ng time per share (default 6, --long 120)
#   --kernel 6.12|6.1 guest kernel (default 6.12)
#   --accel auto|tcg|kvm  (default tcg; auto: KVM when a probe boot proves it works)
#   --timeout SECONDS per boot (default 300, --long 1800)
#   --daemon PATH     test this binary instead of building target/release/virtiofsd
#   --no-build        use the existing target/release/virtiofsd
#   --keep            keep the work dir
#   -v, --verbose     also print the diagnostics of passing tests
# Logs of every boot are kept in target/guest-tests/reliability/. Needs root.
set -uo pipefail

# shellcheck source=tests/lib/common.sh
. "$(dirname "$0")/../lib/common.sh"
OUT="$ROOT/target/guest-tests/reliability"

SCENARIOS="load full kill-qemu kill-qemu-activated kill-daemon host-change fsync"
LONG=0
SECS=""
KERNEL=6.12
ACCEL=tcg
TIMEOUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --scenario) SCENARIOS="${2//,/ }"; shift 2 ;;
        --scenario=*) SCENARIOS="${1#*=}"; SCENARIOS="${SCENARIOS//,/ }"; shift ;;
        --long) LONG=1; shift ;;
        --secs) SECS="$2"; shift 2 ;;
        --kernel) KERNEL="$2"; shift 2 ;;
        --accel) ACCEL="$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        *) common_option "$@" || bad_usage "unknown option $1"; shift "$TAKEN" ;;
    esac
done
case "$ACCEL" in auto|tcg|kvm) ;; *) bad_usage "--accel takes auto, tcg or kvm" ;; esac
for s in $SCENARIOS; do
    case "$s" in
        load|full|kill-qemu|kill-qemu-activated|kill-daemon|host-change|fsync|reconnect) ;;
        *) bad_usage "unknown scenario $s" ;;
    esac
done
# shellcheck disable=SC2034  # FIO_MB and ROUNDS are read by reliability-scenarios.sh
if [ "$LONG" = 1 ]; then
    SECS="${SECS:-120}"; TIMEOUT="${TIMEOUT:-1800}"; FIO_MB=256; ROUNDS=10
else
    SECS="${SECS:-6}"; TIMEOUT="${TIMEOUT:-300}"; FIO_MB=16; ROUNDS=3
fi
need_root "the daemons create files as the guest's callers; loop mounts"

report_start "reliability tests" "$OUT"
work_dir virtiofsd-rel
mkdir -p "$OUT"
# loop mounts to undo: listed in $WORK/mounts (scenarios run in subshells)
unmount_listed() {
    local m
    [ -f "$WORK/mounts" ] && while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done < "$WORK/mounts"
}
at_exit unmount_listed

# --- prerequisites -----------------------------------------------------------------------------
ensure_kit "$OUT/install.log" "$KERNEL" /usr/bin/stress-ng /usr/bin/fio /usr/bin/strace /usr/bin/find
prepare_daemon "$OUT/build.log"
build_helpers "$WORK/helpers"

# The initramfs: the guest kit of run.sh plus Debian's stress-ng and fio (with their shared
# libraries, about 95 MiB).
INITRD="$WORK/initramfs.cpio"
if ! kit_initramfs "$INITRD" "$KERNEL" "$WORK/helpers" \
        /usr/bin/find /usr/bin/strace /usr/bin/stress-ng /usr/bin/fio; then
    result fail "guest kit: stress-ng and fio into the initramfs" "see above"
    finish
fi
choose_accel "$ACCEL" qemu-system-x86_64 "$CACHE/kernel-$KERNEL/vmlinuz" "$INITRD" guest_suite=probe \
    '#PROBE-OK' "$WORK/probe.log"
echo "# initramfs $(( $(stat -c %s "$INITRD") / 1048576 )) MiB; accelerator: ${ACCEL_ARGS[*]}${ACCEL_NOTE:+ ($ACCEL_NOTE)}; long=$LONG secs=$SECS"

# --- daemon and guest --------------------------------------------------------------------------
# Every daemon logs each request (start_daemon, tests/lib/daemon.sh).
DAEMON_ARGS=(--log-level debug)
# serving_pid PID: the process that serves: with the default --sandbox=namespace, the child
# of the supervising daemon (under strace one level further down).
serving_pid() {
    local p="$1" c
    for _ in 1 2 3; do
        c="$(cat /proc/"$p"/task/*/children 2>/dev/null | awk '{print $1}' | head -n 1)"
        [ -n "$c" ] || break
        p="$c"
    done
    echo "$p"
}
nfds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
# anon_kib PID: the daemon's own memory (RssAnon; its VmRSS also counts the pages of guest
# memory it has touched, which are the guest's)
anon_kib() { awk '/^RssAnon:/ { print $2 }' "/proc/$1/status" 2>/dev/null; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null; }

# start_qemu LOGDIR SUITE "EXTRA CMDLINE" SOCK=TAG...: sets QPID. The first device must have
# the tag "share" (guest /init mounts it on /mnt); the suites mount the others. CHARDEV_OPTS
# (e.g. ",reconnect-ms=500") is added to every chardev.
CHARDEV_OPTS=""
start_qemu() {
    local logs="$1" suite="$2" extra="$3" i=0 d; shift 3
    local devs=()
    for d in "$@"; do
        devs+=(-chardev "socket,id=c$i,path=${d%%=*}$CHARDEV_OPTS"
               -device "vhost-user-fs-pci,chardev=c$i,tag=${d#*=},num-request-queues=2")
        i=$((i + 1))
    done
    : > "$logs/console.log"
    start_guest "$logs/console.log" "$logs/qemu.log" "$CACHE/kernel-$KERNEL/vmlinuz" "$INITRD" \
        1536M "guest_suite=$suite $extra" -smp 2 "${devs[@]}"
}

# run_guest LOGDIR HANDLER: waits for QEMU to exit (or TIMEOUT), calling HANDLER MARK for each
# "#MARK name" line of the console as it appears. Sets QRC (exit status, or "timeout").
run_guest() {
    local t0=$SECONDS
    watch_guest "$TIMEOUT" "$2" "$1/console.log"
    [ "$QRC" = timeout ] && return
    qemu_aborted "$1"
    echo "# guest ran $((SECONDS - t0))s"
}
no_handler() { :; }

# qemu_aborted LOGDIR: QEMU 10 under multi-threaded TCG now and then aborts early in the boot
# with "iotlb_to_section: Assertion `section_index < d->map.sections_nb' failed" (a QEMU race,
# not the daemon: about one boot in 60 here). Noted in $WORK/qemu-aborted so that the scenario
# is run once more (see run_scenario).
qemu_aborted() {
    if [ "$QRC" = 134 ] && grep -q 'Assertion .* failed' "$1/qemu.log" 2>/dev/null; then
        cp "$1/qemu.log" "$1.qemu-abort.log"
        echo "$1" >> "$WORK/qemu-aborted"
    fi
}

# run_scenario NAME: runs scenario_NAME in a subshell, its report kept back; when a QEMU of it
# aborted on its own assertion (qemu_aborted), the report is dropped and the scenario run once
# more, saying so.
run_scenario() {
    local s="$1" try out="$WORK/scenario-$1.out"
    for try in 1 2; do
        rm -f "$WORK/qemu-aborted"
        # whatever a scenario left running (it gave up half-way) ends with its subshell
        ( "scenario_${s//-/_}"; kill_tracked ) > "$out" 2>&1
        if [ "$try" = 1 ] && [ -s "$WORK/qemu-aborted" ]; then
            echo "# scenario $s: QEMU aborted on an assertion of its own ($(grep -h 'Assertion' "$(head -n 1 "$WORK/qemu-aborted").qemu-abort.log" | head -n 1)); log kept as $(head -n 1 "$WORK/qemu-aborted").qemu-abort.log; running the scenario again"
            continue
        fi
        break
    done
    # (bash's notices of the QEMUs the scenarios kill are left out)
    grep -vE '^[^ ]*\.sh: line [0-9]+: +[0-9]+ (Killed|Aborted) ' "$out"
    tally "$out"
}

# guest_end PREFIX LOGDIR: the guest's own results, and that it ran to the end
guest_end() {
    local con="$2/console.log"
    report_tap "$con" "$1"
    if [ "$QRC" = 0 ] && grep -q '^#DONE' "$con"; then
        result ok "${1}guest ran to the end and powered off"
    else
        result fail "${1}guest ran to the end and powered off" "QEMU: $QRC; console tail:
$(tr -d '\r' < "$con" | tail -n 25)"
    fi
}
# daemon_end PREFIX PID LOG: the daemon exits 0 by itself within 10 s of the disconnect
daemon_end() {
    local rc
    reap "$2" 10
    rc="$REAPED"
    [ "$rc" = running ] && rc="still running 10 s after QEMU exited (killed)"
    if [ "$rc" = 0 ]; then result ok "${1}daemon exits 0 after the disconnect"
    else result fail "${1}daemon exits 0 after the disconnect" "exit: $rc; log tail:
$(tail -n 15 "$3")"; fi
}

# A fresh directory per scenario.
scen_dir() {
    local d="$WORK/$1" l="$OUT/$1" m
    # a second run (run_scenario) starts afresh too
    [ -f "$WORK/mounts" ] && while read -r m; do
        case "$m" in "$d"/*) umount "$m" 2>/dev/null || umount -l "$m" ;; esac
    done < "$WORK/mounts"
    rm -rf "$l" "$d"; mkdir -p "$d" "$l"
    echo "# scenario $1"
}

# shellcheck source=tests/guest/reliability-scenarios.sh
. "$ROOT/tests/guest/reliability-scenarios.sh"

for s in $SCENARIOS; do
    t0=$SECONDS
    run_scenario "$s"
    echo "# scenario $s took $((SECONDS - t0))s"
done
finish
