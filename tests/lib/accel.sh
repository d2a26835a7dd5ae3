# shellcheck shell=bash
# The accelerator a test guest runs under (sourced, not run). One choice for the guest tests,
# the migration and reliability tests, the guest benchmark and qemu-examples/common.sh.
#
# A writable /dev/kvm is not enough: under nested virtualisation QEMU may abort at the first
# guest instruction, or the guest may hang. So "auto" boots a kernel under KVM first and waits
# for the initramfs to print a marker on the serial console.
#
#   choose_accel MODE [QEMU KERNEL INITRD APPEND MARKER LOG]
#       ACCEL_ARGS: QEMU's flags for MODE.
#         tcg   -accel tcg -cpu max
#         kvm   -accel kvm -cpu host, without a probe (QEMU says so when KVM cannot run a guest)
#         auto  kvm when /dev/kvm is there and kvm_probe with the other arguments succeeds,
#               else tcg; ACCEL_NOTE then says why, when a probe boot failed
#       Returns 2 for another MODE (the caller names its flag).

# kvm_probe QEMU KERNEL INITRD APPEND MARKER LOG: boots KERNEL with INITRD under KVM
# (256 MiB, no devices but the serial console, which goes to LOG) with "console=ttyS0 quiet
# panic=-1 APPEND" on its command line. Succeeds when MARKER appears in LOG within 15 s; fails
# at once when /dev/kvm is not readable and writable. The QEMU it started is killed before it
# returns; KVM_PROBE_PID names it meanwhile, for a caller's exit trap.
kvm_probe() {
    local qemu="$1" kernel="$2" initrd="$3" append="$4" marker="$5" log="$6" ok=1 _
    [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
    rm -f "$log"
    # stderr muted for the whole probe: bash's notice of a QEMU that aborted ("Aborted") or
    # was killed would only clutter the caller's output; QEMU's own goes to LOG.qemu.
    {
        "$qemu" -accel kvm -cpu host -m 256M -machine q35 -nodefaults -display none \
            -no-reboot -monitor none -serial "file:$log" \
            -kernel "$kernel" -initrd "$initrd" \
            -append "console=ttyS0 quiet panic=-1 $append" >"$log.qemu" 2>&1 &
        KVM_PROBE_PID=$!
        for _ in $(seq 1 75); do
            if grep -qF -- "$marker" "$log" 2>/dev/null; then ok=0; break; fi
            kill -0 "$KVM_PROBE_PID" 2>/dev/null || break
            sleep 0.2
        done
        kill -KILL "$KVM_PROBE_PID" 2>/dev/null
        wait "$KVM_PROBE_PID"
        KVM_PROBE_PID=""
    } 2>/dev/null
    return "$ok"
}

# shellcheck disable=SC2034 # ACCEL_ARGS and ACCEL_NOTE are for the caller
choose_accel() {
    local mode="$1"
    shift
    ACCEL_NOTE=""
    case "$mode" in
        tcg) ACCEL_ARGS=(-accel tcg -cpu max) ;;
        kvm) ACCEL_ARGS=(-accel kvm -cpu host) ;;
        auto)
            ACCEL_ARGS=(-accel tcg -cpu max)
            [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 0
            if kvm_probe "$@"; then
                ACCEL_ARGS=(-accel kvm -cpu host)
            else
                ACCEL_NOTE="a guest did not boot under KVM here ($(tail -n 1 "$6.qemu" 2>/dev/null))"
            fi ;;
        *) return 2 ;;
    esac
}
