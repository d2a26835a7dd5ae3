#!/usr/bin/env bash
# virtme-ng (`vng`, from PyPI) boots the Debian 6.12 cloud kernel with the host's root file
# system as the guest's root, served by this daemon, the way kernel developers use it: vng runs
# as an unprivileged user, finds `virtiofsd` first on its PATH, starts it itself (`--syslog
# --no-announce-submounts --readonly --sandbox none --cache always --shared-dir /`) and waits
# for `<socket>.pid`. The same boot has a second share, `--rwdir DIR` (vng starts a second
# daemon: `--cache auto`, writable). TCG (`--disable-kvm`). Checks:
#   - vng exits with the status of the command it ran in the guest (virtme-ng's exit code
#     port), and that command's checks passed;
#   - the guest's `/` is virtiofs (vng falls back to 9p when no daemon starts in time);
#   - a 3 MiB host file read through the root share has the host's SHA-256;
#   - both daemons were this binary (their /proc/PID/exe), ran as the test user, and the guest
#     read the same pid from the `<socket>.pid` file through the share; their command lines;
#   - with `/` remounted read-write in the guest, a write into a directory the test user owns
#     fails with EROFS (the daemon's --readonly) and nothing lands on the host;
#   - a file the guest writes into the --rwdir share lands on the host with its content;
#   - each daemon logged that the frontend disconnected and exited.
# Installs what it needs: tests/guest/install.sh (QEMU 10, busybox, the 6.12 kernel); python3-venv,
# udev (vng's guest init runs the host's systemd-udevd to name its virtio-serial ports, which
# carry the command's output and exit code), kmod (depmod); a venv with virtme-ng from PyPI in
# the cache dir; the full 6.12 kernel package (vmlinuz and its modules: vng loads overlay.ko
# for its writable overlays of /etc, /tmp, ...) unpacked in the cache dir; the test user
# virtiofsd-rootless (the one tests/it/rootless.rs makes).
#
# Usage: tests/guest/virtme-ng.sh [options]
#   --daemon PATH   test this binary instead of building target/release/virtiofsd
#   --no-build      do not run cargo build (use the existing target/release/virtiofsd)
#   --keep          keep the work dir (/virtiofsd-vng.*) for inspection
#   -v, --verbose   also print the diagnostics of passing checks
# Env: VIRTME_NG_VERSION (default 1.42), VIRTIOFSD_GUEST_CACHE (default /var/cache/virtiofsd-guest)
# Prints "ok N name" / "not ok N name" lines and "N passed, N failed"; exits non-zero when a
# check failed. Logs in target/guest-tests/virtme-ng/. Needs root (apt, the test user).
set -uo pipefail

# shellcheck source=tests/lib/common.sh
. "$(dirname "$0")/../lib/common.sh"
VNG_VERSION="${VIRTME_NG_VERSION:-1.42}"
OUT="$ROOT/target/guest-tests/virtme-ng"
USER_NAME=virtiofsd-rootless
while [ $# -gt 0 ]; do
    common_option "$@" || bad_usage "unknown option $1"
    shift "$TAKEN"
done
need_root "apt, a test user"
report_start "virtme-ng stage" "$OUT"
rm -rf "$OUT" && mkdir -p "$OUT"

# --- what vng needs ----------------------------------------------------------------------------
export DEBIAN_FRONTEND=noninteractive
ensure_kit "$OUT/install.log" 6.12
missing=()
for p in python3-venv udev kmod file; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "# apt-get install ${missing[*]}"
    apt-get install -y -q --no-install-recommends "${missing[@]}" >"$OUT/apt.log" 2>&1 \
        || { apt-get update -qq && apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
        >>"$OUT/apt.log" 2>&1 \
        || { result fail "apt-get install ${missing[*]}" "$(tail -n 20 "$OUT/apt.log")"; finish; }
fi

# virtme-ng in a venv of the system's python3 (the test user must be able to run it: a
# python under /root is not reachable for it).
VENV="$CACHE/virtme-ng-$VNG_VERSION"
PY=/usr/bin/python3
[ -x "$PY" ] || PY="$(command -v python3)"
if ! "$VENV/bin/vng" --version >/dev/null 2>&1; then
    echo "# pip install virtme-ng==$VNG_VERSION into $VENV"
    rm -rf "$VENV"
    { "$PY" -m venv "$VENV" && "$VENV/bin/pip" install -q --disable-pip-version-check \
        "virtme-ng==$VNG_VERSION"; } >"$OUT/pip.log" 2>&1 \
        || { result fail "pip install virtme-ng==$VNG_VERSION" "$(tail -n 20 "$OUT/pip.log")"; rm -rf "$VENV"; finish; }
fi
chmod -R a+rX "$VENV"

# The 6.12 kernel as its package lays it out (boot/vmlinuz-KVER, lib/modules/KVER): vng finds
# the modules next to the image and puts overlay.ko into its initramfs.
KDIR="$CACHE/kernel-6.12-vng"
if [ ! -f "$KDIR/.complete" ]; then
    pkg="$(cat "$CACHE/kernel-6.12/.complete")"
    rm -rf "$KDIR" && mkdir -p "$KDIR/deb" && chmod 777 "$KDIR/deb"
    if ! (cd "$KDIR/deb" && apt-get download -qq "$pkg") >"$OUT/kernel.log" 2>&1; then
        # the archive has moved on: take its newest 6.12 cloud kernel
        pkg="$(apt-cache pkgnames linux-image-6.12. \
            | grep -E '^linux-image-6\.12\.[0-9]+\+deb12(\.[0-9]+)?-cloud-amd64$' | sort -rV | head -n 1)"
        (cd "$KDIR/deb" && apt-get download -qq "$pkg") >>"$OUT/kernel.log" 2>&1 \
            || { result fail "apt-get download $pkg" "$(tail -n 20 "$OUT/kernel.log")"; finish; }
    fi
    dpkg-deb -x "$KDIR"/deb/*.deb "$KDIR/root"
    kver="$(ls "$KDIR/root/lib/modules")"
    mkdir -p "$KDIR/boot" "$KDIR/lib/modules"
    mv "$KDIR/root/boot/vmlinuz-$kver" "$KDIR/boot/"
    mv "$KDIR/root/lib/modules/$kver" "$KDIR/lib/modules/"
    rm -rf "$KDIR/root" "$KDIR/deb"
    depmod -a -b "$KDIR" "$kver" >>"$OUT/kernel.log" 2>&1 \
        || { result fail "depmod for $pkg" "$(tail -n 20 "$OUT/kernel.log")"; finish; }
    echo "$pkg" > "$KDIR/.complete"
fi
chmod -R a+rX "$KDIR"
KIMG="$(ls "$KDIR"/boot/vmlinuz-* | head -n 1)"
echo "# kernel: $(cat "$KDIR/.complete"); virtme-ng $("$VENV/bin/vng" --version 2>&1 | head -n 1)"

if ! getent passwd "$USER_NAME" >/dev/null; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin "$USER_NAME" \
        || { result fail "useradd $USER_NAME"; finish; }
fi

prepare_daemon "$OUT/build.log"

# --- the work dir ------------------------------------------------------------------------------
# At the top of the host's tree: vng overlays /etc, /lib, /home, /opt, /srv, /usr, /var and /tmp
# in the guest (writes there stay in the guest), not this directory, so the guest's writes to it
# reach the daemon. It is the same path inside the guest.
work_dir virtiofsd-vng /
chmod 755 "$WORK"
mkdir -p "$WORK"/{bin,home,tmp,ro,rw}
cp "$DAEMON" "$WORK/bin/virtiofsd"     # the build tree may not be reachable by the test user
head -c 3145728 /dev/urandom > "$WORK/fixture.bin"
chmod 644 "$WORK/fixture.bin"
chown "$USER_NAME:" "$WORK"/{home,tmp,ro,rw}
HOST_SUM="$(sha256sum < "$WORK/fixture.bin" | cut -d' ' -f1)"

# Every `<socket>.pid` that appears in vng's TMPDIR: the daemon's pid, executable, uid and
# command line, while it runs.
watch_daemons() {
    local f pid seen=" "
    while :; do
        for f in "$WORK"/tmp/virtme*.pid; do
            [ -s "$f" ] || continue
            pid="$(tr -dc 0-9 < "$f")"
            case "$seen" in *" $pid "*) continue ;; esac
            [ -n "$pid" ] && [ -d "/proc/$pid" ] || continue
            seen="$seen$pid "
            printf '%s\t%s\t%s\t%s\n' "$pid" "$(readlink "/proc/$pid/exe")" \
                "$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")" \
                "$(tr '\0' ' ' < "/proc/$pid/cmdline")" >> "$OUT/daemons.tsv"
        done
        sleep 0.05
    done
}
: > "$OUT/daemons.tsv"
watch_daemons &
WATCH=$!
track "$WATCH"

# The guest's command: each line of its output is a result for the host to check.
cat > "$WORK/guest.sh" <<EOF
#!/bin/sh
echo "root-fstype \$(awk '\$2 == "/" {print \$3}' /proc/mounts)"
echo "fixture-sum \$(sha256sum < $WORK/fixture.bin | cut -d' ' -f1)"
echo "daemon-pids \$(cat $WORK/tmp/virtme*.pid | tr '\n' ' ')"
mount -o remount,rw / && echo remounted-rw
# (/tmp is one of vng's overlays: writable in the guest)
if { echo guest > $WORK/ro/probe; } 2>/tmp/ro.err; then echo ro-write ok
else echo "ro-write \$(cat /tmp/ro.err)"; fi
echo "written by the guest" > $WORK/rw/from-guest && echo rw-write ok
sync
EOF
chmod 755 "$WORK/guest.sh"

echo "# vng --run $(basename "$KIMG") --disable-kvm --rwdir $WORK/rw -- $WORK/guest.sh (as $USER_NAME)"
t0=$(date +%s)
runuser -u "$USER_NAME" -- env -i HOME="$WORK/home" TMPDIR="$WORK/tmp" TERM=dumb \
    PATH="$WORK/bin:$VENV/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin" \
    sh -c "cd '$WORK/home' && exec timeout 300 vng --verbose --run '$KIMG' --disable-kvm \
        --rwdir '$WORK/rw' -- '$WORK/guest.sh' <\"/dev/null\" >'$WORK/home/out.txt' 2>'$WORK/home/err.txt'"
rc=$?
echo "# the boot took $(( $(date +%s) - t0 ))s"
reap "$WATCH" 0
cp "$WORK/home/out.txt" "$OUT/guest-output.txt" 2>/dev/null
cp "$WORK/home/err.txt" "$OUT/vng-stderr.txt" 2>/dev/null   # boot console and daemon logs
OUTPUT="$OUT/guest-output.txt"
val() { sed -n "s/^$1 //p" "$OUTPUT" 2>/dev/null | head -n 1; }

check "vng exits with the guest command's status" "$rc" 0
check "the guest's root is virtiofs" "$(val root-fstype)" virtiofs
check "a 3 MiB host file read through the root share has the host's SHA-256" \
    "$(val fixture-sum)" "$HOST_SUM"

# The daemons: two (root and --rwdir), both this binary, as the test user.
uid="$(id -u "$USER_NAME")"
check "vng started two daemons (root, --rwdir)" "$(wc -l < "$OUT/daemons.tsv")" 2
bad=""
while IFS=$'\t' read -r pid exe duid cmd; do
    echo "# daemon $pid: $cmd"
    [ "$exe" = "$WORK/bin/virtiofsd" ] || bad="$bad pid $pid runs $exe;"
    [ "$duid" = "$uid" ] || bad="$bad pid $pid has uid $duid;"
done < "$OUT/daemons.tsv"
if [ -s "$OUT/daemons.tsv" ] && [ -z "$bad" ]; then
    result ok "each daemon is $WORK/bin/virtiofsd (a copy of $DAEMON), run as $USER_NAME"
else
    result fail "each daemon is $WORK/bin/virtiofsd, run as $USER_NAME" "${bad:-no daemon seen}"
fi
check "the guest read the daemons' pids from <socket>.pid through the share" \
    "$(val daemon-pids | tr ' ' '\n' | grep . | sort | tr '\n' ' ')" \
    "$(cut -f1 "$OUT/daemons.tsv" | sort | tr '\n' ' ')"
bad=""
root_cmd="$(awk -F'\t' '$4 ~ /--shared-dir \/ / {print $4}' "$OUT/daemons.tsv")"
rw_cmd="$(awk -F'\t' -v d="--shared-dir $WORK/rw " 'index($4, d) {print $4}' "$OUT/daemons.tsv")"
for flag in --readonly "--sandbox none" "--cache always" --syslog --no-announce-submounts; do
    case "$root_cmd" in *" $flag "*) ;; *) bad="$bad $flag;" ;; esac
done
if [ -n "$root_cmd" ] && [ -z "$bad" ]; then
    result ok "the root share's daemon: --shared-dir / --readonly --sandbox none --cache always"
else
    result fail "the root share's daemon: --shared-dir / --readonly --sandbox none --cache always" \
        "command line: '${root_cmd:-none}'; missing:$bad"
fi
bad=""
case "$rw_cmd" in
    *" --cache auto "*) case "$rw_cmd" in *--readonly*) bad=ro ;; esac ;;
    *) bad=cache ;;
esac
if [ -n "$rw_cmd" ] && [ -z "$bad" ]; then
    result ok "the --rwdir share's daemon: --cache auto, not read-only"
else
    result fail "the --rwdir share's daemon: --cache auto, not read-only" "command line: '${rw_cmd:-none}'"
fi

check "the guest remounted / read-write" "$(grep -c '^remounted-rw$' "$OUTPUT" 2>/dev/null)" 1
check "a write through the read-only root share fails with EROFS" \
    "$(val ro-write | grep -o 'Read-only file system')" "Read-only file system"
check "nothing landed in the host directory behind the read-only share" "$(ls -A "$WORK/ro")" ""
check "the guest's write through the --rwdir share" "$(val rw-write)" ok
check "the host sees the file the guest wrote into --rwdir" \
    "$(cat "$WORK/rw/from-guest" 2>/dev/null)" "written by the guest"
check "both daemons logged the disconnect and exited" \
    "$(grep -c 'frontend disconnected, exiting' "$OUT/vng-stderr.txt" 2>/dev/null)" 2
# (vng returns when QEMU has exited; the daemons exit on the disconnect, a moment later)
running() {
    cut -f1 "$OUT/daemons.tsv" | while read -r p; do
        grep -qs '^State:[[:space:]]*[^Z]' "/proc/$p/status" && echo "$p"
    done
}
for _ in $(seq 50); do [ -z "$(running)" ] && break; sleep 0.1; done
check "no daemon is left running 5 s after vng returned" "$(running | tr '\n' ' ')" ""
finish
