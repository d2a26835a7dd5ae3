# qemu-examples/common.sh: what every example shares; sourced, not run.
# shellcheck shell=bash
#
# Environment (every variable has a default):
#   VIRTIOFSD      the daemon (default: the tree's target/release/virtiofsd, then
#                  /usr/libexec/virtiofsd, /usr/lib/qemu/virtiofsd, virtiofsd on PATH)
#   SOCKET         vhost-user socket path (default: a fresh temporary directory's vfs.sock)
#   TAG            mount tag the guest uses: mount -t virtiofs $TAG /mnt (default: share)
#   MEM            guest memory size, e.g. 1G (default 1G)
#   QEMU           the QEMU binary (default qemu-system-x86_64)
#   ACCEL          kvm, tcg or auto (default auto: kvm when a probe boot under KVM reaches
#                  the demo initramfs within 15 s, as the guest tests probe; else tcg)
#   DISK           boot this disk image (virtio-blk) ...
#   KERNEL, INITRD ... or this kernel and initramfs (default: the guest test kit's 6.12 kernel
#                  /var/cache/virtiofsd-guest/kernel-6.12/vmlinuz, which is there only once
#                  tests/guest/install.sh has fetched it, and an initramfs built by
#                  mkinitramfs.sh)
#   APPEND         extra kernel command line (with KERNEL)
#   GUEST_SHELL=1  with the demo initramfs: give a shell in the guest instead of powering off
#   VIRTIOFSD_ARGS extra daemon flags (split on spaces), QEMU_ARGS extra QEMU flags
#   DAEMON_LOG     where the daemon's stderr goes (default: next to the socket)

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TREE="$(cd "$HERE/.." && pwd)"
KIT_KERNEL=/var/cache/virtiofsd-guest/kernel-6.12/vmlinuz
# shellcheck source=tests/lib/accel.sh
. "$TREE/tests/lib/accel.sh"
# shellcheck source=tests/lib/daemon.sh
. "$TREE/tests/lib/daemon.sh"

die() { echo "${0##*/}: $*" >&2; exit 1; }

find_virtiofsd() {
    local c
    if [ -n "${VIRTIOFSD:-}" ]; then
        [ -x "$VIRTIOFSD" ] || die "VIRTIOFSD=$VIRTIOFSD is not executable"
        return
    fi
    for c in "$TREE/target/release/virtiofsd" /usr/libexec/virtiofsd /usr/lib/qemu/virtiofsd \
             "$(command -v virtiofsd 2>/dev/null)"; do
        if [ -n "$c" ] && [ -x "$c" ]; then VIRTIOFSD="$c"; return; fi
    done
    die "no virtiofsd found: build it (cargo build --release) or set VIRTIOFSD=/path/to/virtiofsd"
}

# Sets WORKDIR, SOCKET, DAEMON_LOG and the other defaults.
defaults() {
    WORKDIR="$(mktemp -d "${TMPDIR:-/tmp}/virtiofsd-example.XXXXXX")"
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    SOCKET="${SOCKET:-$WORKDIR/vfs.sock}"
    DAEMON_LOG="${DAEMON_LOG:-$WORKDIR/virtiofsd.log}"
    TAG="${TAG:-share}"
    MEM="${MEM:-1G}"
    QEMU="${QEMU:-qemu-system-x86_64}"
    ACCEL="${ACCEL:-auto}"
    command -v "$QEMU" >/dev/null || die "$QEMU not found (apt install qemu-system-x86)"
    find_virtiofsd
}

DAEMON_PID=""
cleanup() {
    [ -n "${KVM_PROBE_PID:-}" ] && kill -KILL "$KVM_PROBE_PID" 2>/dev/null
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID" 2>/dev/null
        wait "$DAEMON_PID" 2>/dev/null
    fi
    rm -rf "${WORKDIR:?}"
}

# start_virtiofsd SHARED_DIR [DAEMON FLAGS...]: starts the daemon in the background on $SOCKET
# and waits until it listens.
start_virtiofsd() {
    local dir="$1"; shift
    [ -d "$dir" ] || die "shared directory $dir does not exist"
    local extra=()
    # shellcheck disable=SC2206 # VIRTIOFSD_ARGS is a space-separated list of flags
    if [ -n "${VIRTIOFSD_ARGS:-}" ]; then extra=($VIRTIOFSD_ARGS); fi
    echo "+ $VIRTIOFSD --socket-path=$SOCKET --shared-dir=$dir $* ${extra[*]}" >&2
    "$VIRTIOFSD" --socket-path="$SOCKET" --shared-dir="$dir" "$@" "${extra[@]}" \
        2>"$DAEMON_LOG" &
    DAEMON_PID=$!
    wait_socket "$SOCKET" "$DAEMON_PID" && return 0
    cat "$DAEMON_LOG" >&2
    die "virtiofsd did not start listening on $SOCKET"
}

# probe_ready KERNEL: with ACCEL=auto, whether a probe boot under KVM can be tried: /dev/kvm is
# there, KERNEL (KERNEL, else the kit's) too, and the demo initramfs is built for it.
probe_ready() {
    [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
    if [ ! -r "$1" ]; then
        echo "ACCEL=auto: no kernel to probe KVM with ($1); using TCG (ACCEL=kvm forces KVM)" >&2
        return 1
    fi
    "$HERE/mkinitramfs.sh" "$WORKDIR/probe.cpio" >/dev/null
}

# Sets QEMU_COMMON: accelerator (tests/lib/accel.sh), machine, console, and what to boot.
qemu_common() {
    local mode="$ACCEL" kernel="${KERNEL:-$KIT_KERNEL}"
    case "$mode" in
        kvm|tcg) ;;
        auto) probe_ready "$kernel" || mode=tcg ;;
        *) die "ACCEL must be kvm, tcg or auto" ;;
    esac
    choose_accel "$mode" "$QEMU" "$kernel" "$WORKDIR/probe.cpio" vfs_probe=1 '#VFS-PROBE-OK' \
        "$WORKDIR/probe.log"
    [ -z "$ACCEL_NOTE" ] || echo "ACCEL=auto: $ACCEL_NOTE; using TCG" >&2
    QEMU_COMMON=("${ACCEL_ARGS[@]}" -machine q35 -m "$MEM" -nodefaults -display none
        -serial mon:stdio -no-reboot)
    if [ -n "${DISK:-}" ]; then
        QEMU_COMMON+=(-drive "file=$DISK,if=virtio")
    else
        KERNEL="${KERNEL:-$KIT_KERNEL}"
        [ -r "$KERNEL" ] || die "no kernel at $KERNEL. That path is the guest test kit's 6.12 kernel, there only once fetched: sudo GUEST_KERNELS=6.12 tests/guest/install.sh (it also installs QEMU 10 from bookworm-backports and the kit's packages). Or set KERNEL= and INITRD=, or DISK="
        if [ -z "${INITRD:-}" ]; then
            INITRD="$WORKDIR/initramfs.cpio"
            "$HERE/mkinitramfs.sh" "$INITRD" >&2 || die "cannot build the demo initramfs"
        fi
        local append="console=ttyS0 quiet panic=-1 vfs_tag=$TAG"
        if [ "${GUEST_SHELL:-0}" = 1 ]; then append+=" vfs_shell=1"; fi
        QEMU_COMMON+=(-kernel "$KERNEL" -initrd "$INITRD" -append "$append ${APPEND:-}")
    fi
    # shellcheck disable=SC2206 # QEMU_ARGS is a space-separated list of flags
    if [ -n "${QEMU_ARGS:-}" ]; then QEMU_COMMON+=($QEMU_ARGS); fi
}

# run_qemu [QEMU FLAGS...]: runs QEMU in the foreground with the common flags, then waits
# (briefly) for the daemon, which exits by itself once QEMU has disconnected.
run_qemu() {
    qemu_common
    echo "+ $QEMU ${QEMU_COMMON[*]} $*" >&2
    local rc=0
    "$QEMU" "${QEMU_COMMON[@]}" "$@" || rc=$?
    local _
    for _ in $(seq 1 50); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$DAEMON_PID" 2>/dev/null; then
        echo "virtiofsd still running after QEMU exited; stopping it" >&2
    else
        wait "$DAEMON_PID" || { echo "virtiofsd exited with status $?; log:" >&2; cat "$DAEMON_LOG" >&2; rc=1; }
        DAEMON_PID=""
    fi
    return "$rc"
}
