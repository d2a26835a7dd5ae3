#!/usr/bin/env bash
# Ownership translated between guest and host. Two ways, chosen with MODE:
#
#   MODE=translate (default)  the daemon translates ids itself (--translate-uid/--translate-gid)
#                             and can run as root: guest uid 0..65535 is host uid 100000..165535,
#                             so files the guest's root creates are owned by 100000 on the host
#                             (as in a container whose ids start at 100000)
#   MODE=userns               the daemon runs in a user namespace (--uid-map/--gid-map) with the
#                             same ranges, so it needs no translation and may be started by an
#                             unprivileged user who owns the host range (see subuid(5))
#
#   qemu-examples/idmapped.sh [SHARED_DIR]      (default ./share; BASE=100000, COUNT=65536)
#
# In the guest (Linux 6.12 or later, util-linux 2.39 or later), an idmapped bind mount shows the
# same files with other owners, without the daemon's help:
#   mount -t virtiofs share /mnt
#   mkdir /idmapped
#   mount --bind -o X-mount.idmap=b:0:1000:1 /mnt /idmapped   # guest uid/gid 0 shown as 1000
# Files created through /idmapped by guest uid 1000 are then created as guest uid 0, which the
# daemon maps to host uid BASE. The demo initramfs has no util-linux mount; use your own guest
# (DISK=) or GUEST_SHELL=1 with a kernel and initramfs that carry util-linux.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
. "$(dirname "$0")/common.sh"

SHARED_DIR="${1:-$PWD/share}"
BASE="${BASE:-100000}"
COUNT="${COUNT:-65536}"
MODE="${MODE:-translate}"
if [ ! -e "$SHARED_DIR" ]; then
    mkdir -p "$SHARED_DIR"
    # Guest root is host uid BASE either way, so a new share belongs to BASE; an existing one
    # is left as it is (chown it to BASE:BASE for the guest's root to write at its top).
    if [ "$(id -u)" = 0 ]; then chown "$BASE:$BASE" "$SHARED_DIR"; fi
fi
defaults
case "$MODE" in
    translate)
        id_flags=(--translate-uid="map:0:$BASE:$COUNT" --translate-gid="map:0:$BASE:$COUNT") ;;
    userns)
        # Inside the namespace, ids 0..COUNT-1 are host ids BASE..; the shared directory must
        # belong to host uid BASE (namespace root) for the guest's root to write to it.
        id_flags=(--uid-map=":0:$BASE:$COUNT:" --gid-map=":0:$BASE:$COUNT:")
        # The daemon creates its socket as host uid BASE: the socket's directory must let it.
        if [ "$(id -u)" = 0 ]; then chown "$BASE:$BASE" "$(dirname "$SOCKET")"; fi ;;
    *) die "MODE must be translate or userns" ;;
esac
start_virtiofsd "$SHARED_DIR" --cache=auto "${id_flags[@]}"
run_qemu \
    -object "memory-backend-memfd,id=mem,size=$MEM,share=on" -numa node,memdev=mem \
    -chardev "socket,id=vfs,path=$SOCKET" \
    -device "vhost-user-fs-pci,chardev=vfs,tag=$TAG,queue-size=1024"
echo "owner on the host of what the guest wrote: $(stat -c %u:%g "$SHARED_DIR/hello-from-guest" 2>/dev/null || echo 'nothing written')"
