#!/usr/bin/env bash
# The plain launch: guest RAM from a memfd, shared with the daemon, and one request queue.
#
#   qemu-examples/memfd.sh [SHARED_DIR]        (default SHARED_DIR: ./share, created if missing)
#
# What matters for virtio-fs:
#   -object memory-backend-memfd,...,share=on   the daemon maps guest RAM to reach the buffers
#   -numa node,memdev=mem                        makes that backend the guest's RAM
#   -chardev socket,path=SOCKET                  the daemon's vhost-user socket
#   -device vhost-user-fs-pci,tag=share          the guest mounts it: mount -t virtiofs share /mnt
#   queue-size=1024                              descriptors per queue (QEMU's default is 128)
# See common.sh for the environment variables (KERNEL, INITRD, DISK, MEM, SOCKET, ...); with
# no KERNEL/DISK the guest test kit's kernel boots a demo initramfs that mounts the share,
# writes hello-from-guest into it and powers off. GUEST_SHELL=1 gives a shell instead.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
. "$(dirname "$0")/common.sh"

SHARED_DIR="${1:-$PWD/share}"
mkdir -p "$SHARED_DIR"
defaults
start_virtiofsd "$SHARED_DIR" --cache=auto
run_qemu \
    -object "memory-backend-memfd,id=mem,size=$MEM,share=on" -numa node,memdev=mem \
    -chardev "socket,id=vfs,path=$SOCKET" \
    -device "vhost-user-fs-pci,chardev=vfs,tag=$TAG,queue-size=1024"
