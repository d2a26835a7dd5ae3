#!/usr/bin/env bash
# Builds a tiny demo initramfs for the examples: busybox and an /init that mounts the virtiofs
# tag given by vfs_tag= on the kernel command line at /mnt, shows what is there, writes
# /mnt/hello-from-guest, unmounts and powers off (or, with vfs_shell=1, gives a shell). With
# vfs_probe=1 it only prints #VFS-PROBE-OK and powers off (common.sh's KVM probe boot).
# The guest kernel must have virtio-pci, FUSE and virtiofs built in (Debian's 6.12 cloud kernel,
# as fetched by tests/guest/install.sh, has).
#
# Usage: qemu-examples/mkinitramfs.sh OUTPUT.cpio
# Needs busybox-static and cpio (apt install busybox-static cpio).
set -euo pipefail

out="${1:?usage: mkinitramfs.sh OUTPUT.cpio}"
busybox="$(command -v busybox || true)"
[ -n "$busybox" ] || { echo "mkinitramfs.sh: busybox not found (apt install busybox-static)" >&2; exit 1; }
if ldd "$busybox" >/dev/null 2>&1; then
    echo "mkinitramfs.sh: $busybox is dynamically linked; install busybox-static" >&2; exit 1
fi
command -v cpio >/dev/null || { echo "mkinitramfs.sh: cpio not found (apt install cpio)" >&2; exit 1; }

st="$(mktemp -d)"
trap 'rm -rf "$st"' EXIT
mkdir -p "$st"/{bin,dev,proc,sys,tmp,mnt,idmapped}
cp "$busybox" "$st/bin/busybox"
ln -s busybox "$st/bin/sh"
cat > "$st/init" <<'INIT'
#!/bin/sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
if grep -q vfs_probe=1 /proc/cmdline; then
    echo "#VFS-PROBE-OK"
    poweroff -f
fi
tag="$(sed -n 's/.*vfs_tag=\([^ ]*\).*/\1/p' /proc/cmdline)"
n=0
while ! grep -q virtiofs /proc/filesystems && [ $n -lt 50 ]; do n=$((n + 1)); sleep 0.1; done
if mount -t virtiofs "${tag:-share}" /mnt; then
    echo "#VFS mounted ${tag:-share} on /mnt:"
    grep ' /mnt ' /proc/mounts
    ls -la /mnt | head -n 20
    echo "hello from $(uname -r)" > /mnt/hello-from-guest && echo "#VFS wrote /mnt/hello-from-guest"
else
    echo "#VFS mount -t virtiofs ${tag:-share} /mnt failed"
fi
if grep -q vfs_shell=1 /proc/cmdline; then
    echo "Shell in the guest; the share is on /mnt. 'poweroff -f' ends the demo."
    setsid cttyhack sh
fi
umount /mnt 2>/dev/null && echo "#VFS unmounted"
poweroff -f
INIT
chmod 755 "$st/init"
(cd "$st" && find . -print0 | cpio --null -o -H newc --quiet) > "$out"
echo "mkinitramfs.sh: wrote $out"
