#!/usr/bin/env bash
# Guest RAM from hugepages: fewer TLB misses for the guest, and fewer, larger regions for the
# daemon to map. The backend must be a file on hugetlbfs with share=on (a private mapping
# would hide the guest's writes from the daemon).
#
#   qemu-examples/hugepages.sh [SHARED_DIR]      (default ./share; HUGEPAGES=/dev/hugepages)
#
# The host needs enough free hugepages for all of MEM before QEMU starts, e.g. for 1 GiB of
# 2 MiB pages, as root:
#   echo 512 > /proc/sys/vm/nr_hugepages        (or vm.nr_hugepages=512 in /etc/sysctl.d/)
#   grep Huge /proc/meminfo                      HugePages_Free must cover MEM
# and hugetlbfs mounted (systemd mounts /dev/hugepages; else mount -t hugetlbfs none DIR).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
. "$(dirname "$0")/common.sh"

SHARED_DIR="${1:-$PWD/share}"
HUGEPAGES="${HUGEPAGES:-/dev/hugepages}"
mkdir -p "$SHARED_DIR"
defaults

# Check before starting anything: QEMU's own error ("unable to map backing store") says little.
grep -qs " $HUGEPAGES hugetlbfs " /proc/mounts ||
    die "$HUGEPAGES is not a hugetlbfs mount (mount -t hugetlbfs none $HUGEPAGES)"
page_kib="$(awk '/^Hugepagesize:/ { print $2 }' /proc/meminfo)"
free_pages="$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)"
mem_kib="$(numfmt --from=iec "${MEM}" | awk '{ print int($1 / 1024) }')"
need_pages=$(( (mem_kib + page_kib - 1) / page_kib ))
if [ "$free_pages" -lt "$need_pages" ]; then
    die "MEM=$MEM needs $need_pages free ${page_kib} KiB hugepages, $free_pages are free
  as root: echo $need_pages > /proc/sys/vm/nr_hugepages   (or lower MEM)"
fi

start_virtiofsd "$SHARED_DIR" --cache=auto
# prealloc=on: take every page at start, so that a shortage fails now, not in the middle of
# the guest's life.
run_qemu \
    -object "memory-backend-file,id=mem,size=$MEM,mem-path=$HUGEPAGES,share=on,prealloc=on" \
    -numa node,memdev=mem \
    -chardev "socket,id=vfs,path=$SOCKET" \
    -device "vhost-user-fs-pci,chardev=vfs,tag=$TAG,queue-size=1024"
