#!/usr/bin/env bash
# A source or build tree that only the guest changes (compiling in the guest, running a test
# suite): --cache=always lets the guest keep pages, attributes, names, symlink targets and
# directory listings for up to a day, so repeated builds do not ask the host again for every
# stat and open. --writeback also gathers small writes in the guest's page cache.
#
#   qemu-examples/build-tree-cache-always.sh [TREE]   (default: the current directory)
#
# Do not edit the tree on the host while the guest uses it: the guest may not see host-side
# changes until it drops its caches (echo 3 > /proc/sys/vm/drop_caches in the guest). For a
# tree edited on the host and built in the guest, use the default --cache=auto (memfd.sh).
# No host process locks a tree only the guest uses, so the guest's locks stay in the guest
# (--posix-lock=off --flock=off): then the guest skips OPEN, FLUSH, RELEASE, OPENDIR and
# RELEASEDIR for cached files and directories (doc/locks.md, doc/caching.md).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
. "$(dirname "$0")/common.sh"

TREE_DIR="${1:-$PWD}"
MEM="${MEM:-4G}"
defaults
start_virtiofsd "$TREE_DIR" --cache=always --writeback --thread-pool-size=4 \
    --posix-lock=off --flock=off
run_qemu -smp "${CPUS:-4}" \
    -object "memory-backend-memfd,id=mem,size=$MEM,share=on" -numa node,memdev=mem \
    -chardev "socket,id=vfs,path=$SOCKET" \
    -device "vhost-user-fs-pci,chardev=vfs,tag=$TAG,num-request-queues=${QUEUES:-4},queue-size=1024"
