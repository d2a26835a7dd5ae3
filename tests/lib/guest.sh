# shellcheck shell=bash
# The guest kit of the QEMU-level tests (sourced, not run; ROOT is the checkout, and the
# functions that report use report.sh, those that start processes proc.sh): what
# tests/guest/install.sh installs, the initramfs a test guest boots, QEMU for it and its console.
# The guest runs busybox as /bin/sh and, where a script asks for them by full path, dynamically
# linked host binaries (GNU find, strace, ...) at the host's paths with their shared libraries
# and loader.
#
#   CACHE                  the kit's cache dir (VIRTIOFSD_GUEST_CACHE, default
#                          /var/cache/virtiofsd-guest): kernel-SERIES/ per guest kernel
#   kit_missing KERNELS [PATH...]  prints what of the kit is missing: QEMU, cpio, busybox-static,
#                          a kernel of KERNELS (space-separated series), a PATH (an executable)
#   install_kit LOG KERNELS  tests/guest/install.sh for KERNELS, its output to LOG
#   ensure_kit LOG KERNELS [PATH...]  install_kit when kit_missing names something; a failed
#                          install is a failed test, and the end
#   build_helpers DIR [NAME...]  tests/guest/helpers/NAME.c (default: all of them) compiled
#                          static into DIR; a failure is a failed test, and the end
#   initramfs_skeleton DIR, initramfs_modules DIR KERNEL_DIR, initramfs_binaries DIR BINARY...,
#   initramfs_pack DIR OUT  the building blocks (below)
#   kit_initramfs OUT KERNEL HELPERS [BINARY...]  the guest tests' initramfs: busybox,
#                          tests/guest/in-guest/init as /init, the in-guest scripts in /tests, the
#                          files of the directory HELPERS in /helpers, the kernel's fuse and
#                          virtiofs modules when it has them as modules, and the host BINARYs
#   start_guest CONSOLE QEMULOG KERNEL INITRD MEM APPEND [QEMU ARG...]
#                          QEMU in the background (ACCEL_ARGS from accel.sh), q35, MEM of memory
#                          shared with the daemons (a memfd; GUEST_SHARED_MEM=0: plain -m MEM), no
#                          device but the serial console (to CONSOLE) and the QEMU ARGs; KERNEL
#                          and INITRD with "console=ttyS0 quiet panic=-1 APPEND". QEMU's output
#                          to QEMULOG. QPID, tracked
#   watch_guest SECONDS HANDLER CONSOLE [SED]  waits for QPID to exit, at most SECONDS (then kills
#                          it); HANDLER ITEM runs for each new item the sed -n script SED prints
#                          from CONSOLE (default: the NAME of each "#MARK NAME" line). QRC is
#                          QEMU's exit status, or "timeout"; QPID is reaped
#   data_of CONSOLE KEY    the value of the last "#DATA KEY VALUE" line of CONSOLE

CACHE="${VIRTIOFSD_GUEST_CACHE:-/var/cache/virtiofsd-guest}"
KIT_DIR="$ROOT/tests/guest"
GUEST_SHARED_MEM=1

kit_missing() {
    local k p
    command -v qemu-system-x86_64 >/dev/null || echo qemu-system-x86_64
    command -v cpio >/dev/null || echo cpio
    dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' ||
        echo busybox-static
    for k in $1; do [ -f "$CACHE/kernel-$k/.complete" ] || echo "kernel $k"; done
    shift
    for p in "$@"; do [ -x "$p" ] || echo "$p"; done
}

install_kit() {
    GUEST_KERNELS="$2" VIRTIOFSD_GUEST_CACHE="$CACHE" "$KIT_DIR/install.sh" >"$1" 2>&1
}

ensure_kit() {
    local log="$1" kernels="$2" missing
    shift 2
    missing="$(kit_missing "$kernels" "$@" | tr '\n' ' ')"
    [ -n "$missing" ] || return 0
    echo "# running tests/guest/install.sh (missing: $missing)"
    if ! install_kit "$log" "$kernels"; then
        result fail "install guest test prerequisites" "$(tail -n 20 "$log")"
        finish
    fi
}

build_helpers() {
    local dir="$1" name names=()
    shift
    mkdir -p "$dir"
    if [ $# -gt 0 ]; then names=("$@"); else
        for name in "$KIT_DIR"/helpers/*.c; do names+=("$(basename "$name" .c)"); done
    fi
    for name in "${names[@]}"; do
        if ! gcc -static -O2 -Wall -o "$dir/$name" "$KIT_DIR/helpers/$name.c" 2>"$dir/$name.err"; then
            result fail "compile helper $name" "$(cat "$dir/$name.err")"
            finish
        fi
        rm -f "$dir/$name.err"
    done
}

# initramfs_skeleton DIR: an empty staging tree with busybox as /bin/busybox and /bin/sh.
initramfs_skeleton() {
    local st="$1"
    rm -rf "$st"
    mkdir -p "$st"/{bin,dev,proc,sys,tmp,mnt,root,modules}
    cp /bin/busybox "$st/bin/busybox"
    ln -s busybox "$st/bin/sh"
}

# initramfs_modules DIR KERNEL_CACHE_DIR: the kernel's fuse/virtiofs modules (and their
# load-order list) when install.sh found them built as modules; nothing when built in.
initramfs_modules() {
    if [ -f "$2/modules/load-order" ]; then
        cp "$2/modules/"* "$1/modules/"
    fi
}

# initramfs_binaries DIR BINARY...: each host binary at its own path inside DIR, with the
# shared libraries and the loader ldd names, also at their host paths.
initramfs_binaries() {
    local st="$1" b l
    shift
    for b in "$@"; do
        [ -x "$b" ] || { echo "initramfs: $b is missing on the host" >&2; return 1; }
        mkdir -p "$st$(dirname "$b")"
        cp -L "$b" "$st$b"
        for l in $(ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
            mkdir -p "$st$(dirname "$l")"
            cp -L "$l" "$st$l"
        done
    done
}

# initramfs_pack DIR OUTFILE: an uncompressed newc cpio of DIR.
initramfs_pack() {
    (cd "$1" && find . -print0 | cpio --null -o -H newc --quiet) > "$2"
}

kit_initramfs() {
    local out="$1" kernel="$2" helpers="$3" st="${1%.cpio}.d"
    shift 3
    initramfs_skeleton "$st"
    mkdir -p "$st"/{tests,helpers}
    cp "$KIT_DIR/in-guest/init" "$st/init"
    chmod 755 "$st/init"
    cp "$KIT_DIR"/in-guest/*.sh "$st/tests/"
    cp "$helpers"/* "$st/helpers/"
    initramfs_modules "$st" "$CACHE/kernel-$kernel"
    if [ $# -gt 0 ] && ! initramfs_binaries "$st" "$@"; then
        rm -rf "$st"
        return 1
    fi
    initramfs_pack "$st" "$out"
    rm -rf "$st"
}

start_guest() {
    local console="$1" qlog="$2" kernel="$3" initrd="$4" mem="$5" append="$6"
    shift 6
    local memory=(-m "$mem" -object "memory-backend-memfd,id=mem,size=$mem,share=on"
                  -numa "node,memdev=mem")
    [ "$GUEST_SHARED_MEM" = 1 ] || memory=(-m "$mem")
    qemu-system-x86_64 "${ACCEL_ARGS[@]}" "${memory[@]}" -machine q35 -nodefaults \
        -display none -no-reboot -monitor none -serial "file:$console" \
        -kernel "$kernel" -initrd "$initrd" -append "console=ttyS0 quiet panic=-1 $append" \
        "$@" >"$qlog" 2>&1 </dev/null &
    QPID=$!
    track "$QPID"
}

watch_guest() {
    local t0=$SECONDS seen=0 items
    QRC=""
    while kill -0 "$QPID" 2>/dev/null; do
        if [ $((SECONDS - t0)) -ge "$1" ]; then QRC=timeout; break; fi
        sleep 0.2
        mapfile -t items < <(tr -d '\r' 2>/dev/null < "$3" |
            sed -n "${4:-s/^#MARK \([A-Za-z0-9_-]*\).*/\1/p}")
        while [ "$seen" -lt "${#items[@]}" ]; do
            "$2" "${items[$seen]}"
            seen=$((seen + 1))
        done
    done
    reap "$QPID" 0
    [ "$QRC" = timeout ] || QRC="$REAPED"
}

data_of() { tr -d '\r' < "$1" | sed -n "s/^#DATA $2 //p" | tail -n 1; }
