#!/usr/bin/env bash
# Installs what the guest-level tests need on a Debian 12 (bookworm) machine, idempotently:
#   - bookworm-backports in the apt sources (added if missing)
#   - qemu-system-x86 from bookworm-backports (QEMU 10), busybox-static, cpio, gcc, libc6-dev,
#     findutils and strace (GNU find and strace go into the guest with their shared libraries);
#     git (the guest benchmark's git-status step);
#     for the guest benchmark's build steps GNU make and tcc (they go into its guest too); for
#     the reliability tests stress-ng and fio (into their guest, with their shared libraries)
#   - the newest 6.12 cloud kernel (bookworm-backports) and the newest 6.1 cloud kernel
#     (bookworm), fetched with `apt-get download` into a cache dir and unpacked there;
#     on request (GUEST_KERNELS=6.12-generic) also the newest generic 6.12 kernel, which the
#     guest benchmark uses because, unlike the cloud kernels, it has 9p (as modules).
# The cloud kernels have virtio-pci, FUSE and virtiofs built in (checked against the config
# shipped in the .deb); if a kernel ships them (or 9p) as modules instead, the modules are
# unpacked too (decompressed when the kernel compresses them) and the guest kits put them into
# the initramfs.
#
# Usage: tests/guest/install.sh            (as root)
# Env:   VIRTIOFSD_GUEST_CACHE  cache dir (default /var/cache/virtiofsd-guest)
#        GUEST_KERNELS          which kernels to fetch (default "6.12 6.1")
set -euo pipefail

CACHE="${VIRTIOFSD_GUEST_CACHE:-/var/cache/virtiofsd-guest}"
KERNELS="${GUEST_KERNELS:-6.12 6.1}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

log() { echo "install.sh: $*" >&2; }

# --- apt sources -------------------------------------------------------------------------------
have_backports() {
    grep -rqsE '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null
}
if ! have_backports; then
    log "adding bookworm-backports to /etc/apt/sources.list.d/backports.sources"
    $SUDO tee /etc/apt/sources.list.d/backports.sources >/dev/null <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    rm -f "$CACHE/.apt-updated"
fi

mkdir -p "$CACHE"
# One `apt-get update` per day is enough (the stamp keeps reruns fast).
if [ -z "$(find "$CACHE/.apt-updated" -mmin -1440 2>/dev/null)" ] \
   || ! apt-cache policy qemu-system-x86 2>/dev/null | grep 'bpo12' >/dev/null; then
    log "apt-get update"
    $SUDO apt-get update -qq
    touch "$CACHE/.apt-updated"
fi

# --- packages ----------------------------------------------------------------------------------
# apt_install ARGS...: quiet install; the full output goes to $CACHE/apt.log, shown on failure.
apt_install() {
    if ! $SUDO apt-get install -y -q --no-install-recommends "$@" >"$CACHE/apt.log" 2>&1; then
        tail -n 30 "$CACHE/apt.log" >&2
        return 1
    fi
}
qemu_ver="$(dpkg-query -W -f='${Status} ${Version}' qemu-system-x86 2>/dev/null || true)"
case "$qemu_ver" in
    "install ok installed 1:1"[0-9]*) ;;     # QEMU >= 10 already there
    *)
        log "installing qemu-system-x86 from bookworm-backports"
        apt_install -t bookworm-backports qemu-system-x86 ;;
esac

missing=()
for p in busybox-static cpio gcc libc6-dev findutils strace xz-utils make tcc stress-ng fio git; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# run.sh makes its fixtures (sockets, xattrs, device nodes) with python3
command -v python3 >/dev/null || missing+=(python3)
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    apt_install "${missing[@]}"
fi

# --- kernels -----------------------------------------------------------------------------------
# newest_pkg SERIES: the newest signed cloud image package of that series known to apt.
newest_pkg() {
    local series="$1" re
    case "$series" in
        6.12) re='^linux-image-6\.12\.[0-9]+\+deb12(\.[0-9]+)?-cloud-amd64$' ;;
        6.12-generic) re='^linux-image-6\.12\.[0-9]+\+deb12(\.[0-9]+)?-amd64$' ;;
        6.1)  re='^linux-image-6\.1\.0-[0-9]+-cloud-amd64$' ;;
        *) log "unknown kernel series $series"; return 1 ;;
    esac
    local p
    for p in $(apt-cache pkgnames linux-image-6. | grep -E "$re" | sort -rV); do
        # the first (newest) one with a downloadable candidate
        if apt-cache policy "$p" | grep 'Candidate: [0-9]' >/dev/null; then
            echo "$p"
            return 0
        fi
    done
}

# Kernel config symbols that must be y (built in) or m (then we ship the module).
NEEDED_SYMS="CONFIG_VIRTIO_PCI CONFIG_VIRTIO_FS CONFIG_FUSE_FS CONFIG_SERIAL_8250_CONSOLE"
# and, for the kernels the benchmark's 9p column boots, 9p over virtio
NEEDED_9P_SYMS="CONFIG_NETFS_SUPPORT CONFIG_NET_9P CONFIG_NET_9P_VIRTIO CONFIG_9P_FS"

fetch_kernel() {
    local series="$1" pkg dir deb cfg
    dir="$CACHE/kernel-$series"
    if [ -f "$dir/vmlinuz" ] && [ -f "$dir/.complete" ]; then
        log "kernel $series cached: $(cat "$dir/.complete")"
        return 0
    fi
    pkg="$(newest_pkg "$series")"
    if [ -z "$pkg" ]; then
        log "no cloud kernel package found for $series"
        return 1
    fi
    log "downloading $pkg"
    rm -rf "$dir" && mkdir -p "$dir/deb"
    chmod 777 "$dir/deb"    # apt-get download runs as the _apt user when it can
    (cd "$dir/deb" && apt-get download -qq "$pkg")
    deb="$(ls "$dir"/deb/*.deb | head -n1)"
    dpkg-deb -x "$deb" "$dir/root"
    cp "$(ls "$dir"/root/boot/vmlinuz-* | head -n1)" "$dir/vmlinuz"
    cfg="$(ls "$dir"/root/boot/config-* | head -n1)"
    cp "$cfg" "$dir/config"
    : > "$dir/modules.list"
    local syms="$NEEDED_SYMS"
    case "$series" in *-generic) syms="$syms $NEEDED_9P_SYMS" ;; esac
    for s in $syms; do
        v="$(grep -E "^$s=" "$cfg" | cut -d= -f2 || true)"
        log "  $series: $s=${v:-unset}"
        case "$v" in
            y) ;;
            m) echo "$s" >> "$dir/modules.list" ;;
            *) log "kernel $series lacks $s: unusable"; return 1 ;;
        esac
    done
    if [ -s "$dir/modules.list" ]; then
        # Keep the modules the guest has to load (fuse, virtiofs, 9p and what they depend on).
        local kver mroot
        kver="$(ls "$dir/root/lib/modules" | head -n1)"
        mroot="$dir/root/lib/modules/$kver"
        mkdir -p "$dir/modules"
        # In dependency order (from each module's depends= field); the guest /init insmods
        # them in the order of load-order. Built-in ones are simply not found and skipped.
        for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci \
                 fuse virtiofs netfs 9pnet 9pnet_virtio 9p; do
            f="$(find "$mroot" -name "$m.ko" | head -n1)"
            if [ -n "$f" ]; then
                cp "$f" "$dir/modules/"
                echo "$m.ko" >> "$dir/modules/load-order"
            elif f="$(find "$mroot" -name "$m.ko.xz" | head -n1)" && [ -n "$f" ]; then
                # busybox insmod takes plain ELF modules only
                xz -dc "$f" > "$dir/modules/$m.ko"
                echo "$m.ko" >> "$dir/modules/load-order"
            elif find "$mroot" -name "$m.ko.*" | grep . >/dev/null; then
                log "kernel $series: $m is compressed in a format this script does not unpack"; return 1
            fi
        done
    fi
    # Keep only what we use: vmlinuz, config, modules.
    rm -rf "$dir/root" "$dir/deb"
    echo "$pkg" > "$dir/.complete"
    log "kernel $series ready: $pkg"
}

rc=0
for k in $KERNELS; do
    fetch_kernel "$k" || rc=1
done

log "qemu: $(qemu-system-x86_64 --version | head -n1)"
log "done (cache: $CACHE)"
exit $rc
