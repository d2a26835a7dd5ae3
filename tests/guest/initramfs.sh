# shellcheck shell=bash
# Initramfs building blocks shared by tests/guest/run.sh and tests/bench/guest.sh (sourced, not
# run). The guest runs busybox as /bin/sh and, where a script asks for them by full path,
# dynamically linked host binaries (GNU find, tar, ...) at the host's paths with their shared
# libraries and loader.

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
