# shellcheck shell=bash
# Whether KVM can run a guest here, found out by booting one (sourced, not run). Shared by the
# guest tests (tests/guest/run.sh) and the QEMU examples (qemu-examples/common.sh).
#
# A writable /dev/kvm is not enough: under nested virtualisation QEMU may abort at the first
# guest instruction, or the guest may hang. So the probe boots a kernel under KVM and waits
# for the initramfs to print a marker on the serial console.

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
