#!/usr/bin/env bash
# Four request queues and four vCPUs: the guest spreads requests over the queues by CPU (Linux
# 6.11 and later; older guests use only the first queue), and the daemon serves every queue
# on its own thread, so parallel I/O from several guest CPUs proceeds in parallel.
#
#   qemu-examples/multiqueue.sh [SHARED_DIR]     (default ./share; QUEUES=4, CPUS=$QUEUES)
#
# --thread-pool-size=N (VIRTIOFSD_ARGS) adds a pool of N threads behind the queue threads, for
# workloads with many slow requests per queue; without it each queue thread does the work.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
. "$(dirname "$0")/common.sh"

SHARED_DIR="${1:-$PWD/share}"
QUEUES="${QUEUES:-4}"
CPUS="${CPUS:-$QUEUES}"
mkdir -p "$SHARED_DIR"
defaults
start_virtiofsd "$SHARED_DIR" --cache=auto
run_qemu -smp "$CPUS" \
    -object "memory-backend-memfd,id=mem,size=$MEM,share=on" -numa node,memdev=mem \
    -chardev "socket,id=vfs,path=$SOCKET" \
    -device "vhost-user-fs-pci,chardev=vfs,tag=$TAG,num-request-queues=$QUEUES,queue-size=1024"
