#!/usr/bin/env bash
# Real-client check through libvirt: libvirt launches target/release/virtiofsd itself for a
# domain's <filesystem> (<binary path=...>, libvirt's own command line; or, with
# --descriptor, the daemon a vhost-user descriptor names), boots a TCG guest
# (tests/guest's 6.12 cloud kernel, a tiny busybox initramfs) that mounts the share, writes a
# marker file into it, prints a line on the console and powers off. The host then checks the
# marker file. Prints "ok N name" / "not ok N name" lines and a last line "N passed, N failed";
# exits non-zero when a test failed (with the console tail, libvirt's domain log and the
# virtiofsd log libvirt keeps).
#
# Usage: tests/libvirt/run.sh [options]            (as root)
#   --daemon PATH     give libvirt this binary instead of building target/release/virtiofsd
#                     (e.g. /opt/ref-virtiofsd/bin/virtiofsd to validate the setup itself)
#   --no-build        do not run cargo build (use the existing target/release/virtiofsd)
#   --no-wrap         put the daemon itself into <binary path>; by default a tiny wrapper script
#                     is put there that records each argv libvirt uses and execs the daemon
#   --descriptor PATH no <binary path>: libvirt picks the daemon from the vhost-user
#                     descriptors (/usr/share/qemu/vhost-user/*.json, as an installed package
#                     leaves them); PATH is the binary it must run (checked in the domain's
#                     live XML and in /proc while the guest runs). Implies --no-build.
#   --boot LIST       which boots, comma-separated (default "all" = plain,options):
#                       plain    <filesystem> exactly as a minimal domain has it
#                       options  <binary xattr='on'> with <cache mode='always'/>,
#                                <lock posix='off' flock='off'/>, <thread_pool size='4'/>
#                                (libvirt turns them into more daemon arguments)
#   --timeout SECS    how long to wait for each guest to power off (default 180)
#   --libvirt-suite S install libvirt from this suite if it is missing (default: bookworm's
#                     9.0; "bookworm-backports" would get 11.3 but also upgrades systemd and
#                     libxml2 -- not tried)
#   --keep            keep the work dir (share, initramfs, domain XML, logs)
#   -v, --verbose     also print the diagnostics of passing tests
# Logs are kept in target/libvirt-tests/.
#
# No systemd is needed: libvirtd (monolithic; bookworm's libvirt has no virtqemud) is started
# here in the background, in a private mount namespace whose /etc/libvirt and /run/libvirt are
# work-dir directories (own qemu.conf and libvirtd.conf, pid file, client socket under the work
# dir), and stopped at exit. No virtlogd: qemu.conf says stdio_handler = "file".
set -uo pipefail

# shellcheck source=tests/lib/common.sh
. "$(dirname "$0")/../lib/common.sh"
OUT="$ROOT/target/libvirt-tests"
KERNEL_SERIES=6.12

WRAP=1
DESCRIPTOR=""
TIMEOUT=180
BOOTS=all
LIBVIRT_SUITE=""
while [ $# -gt 0 ]; do
    case "$1" in
        --no-wrap) WRAP=0; shift ;;
        --descriptor) DESCRIPTOR="$2"; shift 2 ;;
        --descriptor=*) DESCRIPTOR="${1#*=}"; shift ;;
        --boot) BOOTS="$2"; shift 2 ;;
        --boot=*) BOOTS="${1#*=}"; shift ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        --timeout=*) TIMEOUT="${1#*=}"; shift ;;
        --libvirt-suite) LIBVIRT_SUITE="$2"; shift 2 ;;
        --libvirt-suite=*) LIBVIRT_SUITE="${1#*=}"; shift ;;
        *) common_option "$@" || bad_usage "unknown option $1"; shift "$TAKEN" ;;
    esac
done
if [ -n "$DESCRIPTOR" ]; then
    [ -z "$DAEMON" ] || bad_usage "--descriptor and --daemon exclude each other"
    case "$DESCRIPTOR" in /*) ;; *) bad_usage "--descriptor takes an absolute path" ;; esac
    DAEMON="$DESCRIPTOR"; BUILD=0; WRAP=0
fi
[ "$BOOTS" = all ] && BOOTS="plain,options"
BOOTS="${BOOTS//,/ }"
for b in $BOOTS; do
    case "$b" in plain|options) ;; *) bad_usage "--boot takes plain, options or all" ;; esac
done
need_root "system libvirtd; libvirt runs virtiofsd as root"

report_start "libvirt check" "$OUT"
mkdir -p "$OUT"
rm -rf "$OUT"/*.log "$OUT"/plain "$OUT"/options
work_dir virtiofsd-libvirt
chmod 755 "$WORK"
DOM_BASE="virtiofsd-libvirt-$$"
DOMS=()    # domains started (destroyed at exit if still there)
URI=""
LIBVIRTD_PID=""

show() {   # show TITLE FILE [LINES]
    echo "# --- $1 ($2) ---"
    if [ -s "$2" ]; then
        tail -n "${3:-30}" "$2" | tr -d '\r' | sed 's/^/#   /'
    else
        echo "#   (missing or empty)"
    fi
}

libvirtd_errors() {
    grep -E ' (error|warning) : ' "$WORK/libvirtd.log" 2>/dev/null |
        grep -vE 'dnsmasq|GDBus|system bus|udev|dmidecode|firewalld|DMI|/dev/mem|tainted' \
        >"$WORK/libvirtd-errors.txt"
    show "libvirtd errors and warnings (startup noise filtered)" "$WORK/libvirtd-errors.txt" 15
}

virsh_() { virsh -q -c "$URI" "$@"; }

# At exit: the log kept, the domains destroyed, libvirtd stopped (it is not our child: it
# daemonized).
stop_libvirt() {
    local d p="$LIBVIRTD_PID" _
    [ -f "$WORK/libvirtd.log" ] && cp "$WORK/libvirtd.log" "$OUT/libvirtd.log"
    for d in "${DOMS[@]}"; do
        virsh_ domstate "$d" >/dev/null 2>&1 && virsh_ destroy "$d" >/dev/null 2>&1
    done
    [ -n "$p" ] || return 0
    kill -TERM "$p" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    return 0
}
at_exit stop_libvirt

# --- prerequisites -----------------------------------------------------------------------------
export DEBIAN_FRONTEND=noninteractive
ensure_kit "$OUT/install.log" "$KERNEL_SERIES" /bin/busybox
# libvirt: the QEMU driver, the daemon (libvirtd) and virsh. Not
# libvirt-daemon-system: it pulls in systemd, iptables, polkit config and network setup.
LV_PKGS="libvirt-daemon-driver-qemu libvirt-daemon libvirt-clients"
if ! command -v libvirtd >/dev/null || ! command -v virsh >/dev/null \
   || [ ! -e /usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so ]; then
    echo "# installing $LV_PKGS${LIBVIRT_SUITE:+ from $LIBVIRT_SUITE}"
    if ! apt-get install -y -q --no-install-recommends ${LIBVIRT_SUITE:+-t "$LIBVIRT_SUITE"} $LV_PKGS \
            >"$OUT/apt.log" 2>&1; then
        result fail "install libvirt" "$(tail -n 20 "$OUT/apt.log")"
        finish
    fi
fi
# libvirt's state dirs (libvirt-daemon-system would make them); logs of the domain go to
# /var/log/libvirt/qemu/, the QEMU capabilities cache to /var/cache/libvirt/qemu/.
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu /var/cache/libvirt/qemu /run/libvirt /etc/libvirt
# Debian builds the QEMU driver with qemu_user/qemu_group libvirt-qemu and its state driver
# resolves that user before it reads qemu.conf: without it libvirtd refuses to start ("Failed to
# parse user 'libvirt-qemu'"). libvirt-daemon-system would create it; we only create the system
# user and group (QEMU itself runs as root, see qemu.conf below).
if ! getent passwd libvirt-qemu >/dev/null; then
    echo "# creating the system user libvirt-qemu"
    useradd --system --user-group --no-create-home --home-dir /var/lib/libvirt \
        --shell /usr/sbin/nologin libvirt-qemu
fi
echo "# libvirt $(dpkg-query -W -f='${Version}' libvirt-daemon-driver-qemu), QEMU $(dpkg-query -W -f='${Version}' qemu-system-x86)"

# --- the daemon --------------------------------------------------------------------------------
prepare_daemon "$OUT/build.log"
echo "# daemon: $DAEMON"

# Newer libvirt releases run BINARY --print-capabilities and expect {"type":"fs", ...}; 9.0
# does not ask (see argv.log), but checking it here keeps the requirement visible.
caps="$("$DAEMON" --print-capabilities 2>&1)"; caps_rc=$?
caps_type="$(printf '%s' "$caps" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("type"))' 2>/dev/null)"
if [ "$caps_rc" = 0 ] && [ "$caps_type" = fs ]; then
    result ok "daemon --print-capabilities prints JSON with type fs" "$(printf '%s' "$caps" | tr -d '\n ')"
else
    result fail "daemon --print-capabilities prints JSON with type fs" "exit $caps_rc: $(printf '%s' "$caps" | head -n 8)"
fi

# --- guest: kernel and a tiny initramfs -----------------------------------------------------
KERNEL="$CACHE/kernel-$KERNEL_SERIES/vmlinuz"
st="$WORK/initramfs"
initramfs_skeleton "$st"
cat >"$st/init" <<'EOF'
#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
token="$(sed -n 's/.*lv_token=\([^ ]*\).*/\1/p' /proc/cmdline)"
echo "#GUEST kernel=$(uname -r)"
n=0
while ! grep -q virtiofs /proc/filesystems && [ $n -lt 50 ]; do n=$((n + 1)); sleep 0.1; done
if mount -t virtiofs share /mnt; then
    echo "#MOUNTED $(grep ' /mnt ' /proc/mounts)"
    if echo "$token" > /mnt/libvirt-marker.txt && sync && [ "$(cat /mnt/libvirt-marker.txt)" = "$token" ]; then
        echo "#MARKER-WRITTEN $token"
    else
        echo "#MARKER-FAILED"
    fi
    ls -la /mnt
    umount /mnt && echo "#UNMOUNTED"
else
    echo "#MOUNT-FAILED"
fi
sync
poweroff -f
EOF
chmod 755 "$st/init"
initramfs_pack "$st" "$WORK/initramfs.cpio"

# --- libvirt -----------------------------------------------------------------------------------
if pgrep -x libvirtd >/dev/null || pgrep -x virtqemud >/dev/null; then
    result fail "start libvirtd" "a libvirtd/virtqemud is already running ($(pgrep -ax 'libvirtd|virtqemud' | head -n 3)); stop it first"
    finish
fi
# libvirtd runs in a private mount namespace in which /etc/libvirt and /run/libvirt are
# directories of the work dir, so its config (qemu.conf), pid file and runtime state stay
# private and nothing is written to the host's /etc/libvirt:
#   qemu.conf: user/group root (Debian's built-in default is libvirt-qemu, a user only
#     libvirt-daemon-system creates; as that user libvirt also finds the root-only /dev/kvm
#     unusable and re-probes QEMU's capabilities on every lookup, ~60 s per start);
#     stdio_handler "file": libvirtd writes the domain and virtiofsd logs itself, no virtlogd.
#   libvirtd.conf: the client socket in $WORK/run (outside the namespace, for virsh).
mkdir -p "$WORK/etc-libvirt" "$WORK/run-libvirt" "$WORK/run"
cat >"$WORK/etc-libvirt/qemu.conf" <<EOF
user = "root"
group = "root"
stdio_handler = "file"
EOF
cat >"$WORK/etc-libvirt/libvirtd.conf" <<EOF
unix_sock_dir = "$WORK/run"
log_outputs = "3:file:$WORK/libvirtd.log"
EOF
t0=$(date +%s)
unshare --mount --propagation private sh -c '
    mount --bind "$1/etc-libvirt" /etc/libvirt && mount --bind "$1/run-libvirt" /run/libvirt &&
    exec libvirtd -d -f "$1/etc-libvirt/libvirtd.conf" -p "$1/libvirtd.pid"' sh "$WORK" \
    >"$WORK/libvirtd.err" 2>&1
URI="qemu:///system?socket=$WORK/run/libvirt-sock"
up=0
for _ in $(seq 1 150); do
    [ -z "$LIBVIRTD_PID" ] && [ -s "$WORK/libvirtd.pid" ] && LIBVIRTD_PID="$(cat "$WORK/libvirtd.pid")"
    [ -n "$LIBVIRTD_PID" ] && ! kill -0 "$LIBVIRTD_PID" 2>/dev/null && break   # it gave up
    if [ -S "$WORK/run/libvirt-sock" ] && virsh_ version >"$WORK/version.txt" 2>&1; then up=1; break; fi
    sleep 0.2
done
if [ "$up" = 1 ]; then
    result ok "libvirtd started ($(( $(date +%s) - t0 ))s; private socket $WORK/run/libvirt-sock)" "$(cat "$WORK/version.txt")"
else
    result fail "libvirtd started" "$(cat "$WORK/libvirtd.err" "$WORK/version.txt" 2>/dev/null)"
    libvirtd_errors
    finish
fi

# --- boots -------------------------------------------------------------------------------------
# daemon_processes SHARE: "exe=PATH argv..." of each process whose command line names SHARE
# (libvirt passes it as -o source=SHARE), one a line.
daemon_processes() {
    local p exe args
    for p in /proc/[0-9]*; do
        args="$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)" || continue
        case "$args" in *"source=$1"*) ;; *) continue ;; esac
        exe="$(readlink "$p/exe" 2>/dev/null)" || continue
        echo "exe=$exe $args"
    done
}

# boot NAME: one transient domain; its share, console, XML and argv log in $WORK/NAME, copies
# of all logs in $OUT/NAME/.
boot() {
    local name="$1" d="$WORK/$1" dom="$DOM_BASE-$1" p="[$1] " token binary bin_xml
    local qlog="/var/log/libvirt/qemu/$dom.log" flog="/var/log/libvirt/qemu/$dom-fs0-virtiofsd.log"
    local failed_before=$FAILED t0 gone=0 boot_secs console got
    mkdir -p "$d/share" "$OUT/$name"
    rm -f "$OUT/$name"/*
    echo "from the host" >"$d/share/host-file.txt"
    token="marker-$name-$$-$(date +%s%N)"
    binary="$DAEMON"
    local path_attr="path='$binary' "
    [ -n "$DESCRIPTOR" ] && path_attr=""
    if [ "$WRAP" = 1 ]; then
        # records each argv libvirt uses (one line, shell-quoted), then becomes the daemon
        binary="$d/virtiofsd-wrapper"
        cat >"$binary" <<EOF
#!/bin/sh
{ printf '%s' "\$(date +%T)"; for a in "\$0" "\$@"; do printf " '%s'" "\$a"; done; echo; } >> '$d/argv.log'
exec '$DAEMON' "\$@"
EOF
        chmod 755 "$binary"
        path_attr="path='$binary' "
    fi
    case "$name" in
        plain) bin_xml="<binary ${path_attr}/>" ;;
        options) bin_xml="<binary ${path_attr}xattr='on'>
        <cache mode='always'/>
        <lock posix='off' flock='off'/>
        <thread_pool size='4'/>
      </binary>" ;;
    esac
    cat >"$d/domain.xml" <<EOF
<domain type='qemu'>
  <name>$dom</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <memoryBacking>
    <source type='memfd'/>
    <access mode='shared'/>
  </memoryBacking>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>$KERNEL</kernel>
    <initrd>$WORK/initramfs.cpio</initrd>
    <cmdline>console=ttyS0 panic=-1 lv_token=$token</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>$(command -v qemu-system-x86_64)</emulator>
    <filesystem type='mount' accessmode='passthrough'>
      <driver type='virtiofs' queue='1024'/>
      $bin_xml
      <source dir='$d/share'/>
      <target dir='share'/>
    </filesystem>
    <serial type='file'>
      <source path='$d/console.log'/>
      <target port='0'/>
    </serial>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
EOF
    rm -f "$qlog" "$flog"
    t0=$(date +%s)
    if virsh_ create "$d/domain.xml" >"$d/create.txt" 2>&1; then
        DOMS+=("$dom")
        result ok "${p}virsh create: libvirt started the daemon and QEMU ($(( $(date +%s) - t0 ))s)" "$(cat "$d/create.txt")"
        [ -n "$DESCRIPTOR" ] && virsh_ dumpxml "$dom" >"$d/live.xml" 2>&1
        while [ $(( $(date +%s) - t0 )) -lt "$TIMEOUT" ]; do
            [ -n "$DESCRIPTOR" ] && daemon_processes "$d/share" >>"$d/processes.txt"
            if ! virsh_ domstate "$dom" >/dev/null 2>&1; then gone=1; break; fi
            sleep 0.5
        done
        boot_secs=$(( $(date +%s) - t0 ))
        if [ "$gone" = 1 ]; then
            result ok "${p}guest powered off, domain gone (${boot_secs}s)"
        else
            result fail "${p}guest powered off, domain gone" "still $(virsh_ domstate "$dom" 2>&1) after ${TIMEOUT}s"
            virsh_ destroy "$dom" >/dev/null 2>&1
        fi
        console="$(tr -d '\r' <"$d/console.log" 2>/dev/null)"
        if grep -q '^#MOUNTED ' <<<"$console"; then
            result ok "${p}guest mounted the share with -t virtiofs" "$(grep '^#MOUNTED ' <<<"$console")"
        else
            result fail "${p}guest mounted the share with -t virtiofs" "$(grep -E '^#|virtio|fuse' <<<"$console" | tail -n 10)"
        fi
        if grep -qx "#MARKER-WRITTEN $token" <<<"$console"; then
            result ok "${p}guest wrote the marker file and read it back"
        else
            result fail "${p}guest wrote the marker file and read it back" "$(grep -E '^#' <<<"$console" | tail -n 5)"
        fi
        got="$(cat "$d/share/libvirt-marker.txt" 2>&1)"
        if [ "$got" = "$token" ]; then
            result ok "${p}host: the marker file in the share holds the guest's token"
        else
            result fail "${p}host: the marker file in the share holds the guest's token" "got '$got', expected '$token'"
        fi
        if grep -q '^#UNMOUNTED' <<<"$console"; then
            result ok "${p}guest unmounted the share"
        else
            result fail "${p}guest unmounted the share" "$(grep -E '^#' <<<"$console" | tail -n 5)"
        fi
        if [ -n "$DESCRIPTOR" ]; then
            # libvirt fills in the binary it took from the descriptor in the live definition.
            got="$(grep -o "<binary [^>]*path=['\"][^'\"]*" "$d/live.xml" 2>/dev/null | sed "s/.*path=['\"]//")"
            if [ "$got" = "$DESCRIPTOR" ]; then
                result ok "${p}libvirt took $DESCRIPTOR from the vhost-user descriptor (live XML)"
            else
                result fail "${p}libvirt took $DESCRIPTOR from the vhost-user descriptor (live XML)" \
                    "live XML names '${got}'; $(grep -A3 '<filesystem' "$d/live.xml" 2>/dev/null)"
            fi
            # Every process serving the share ran that file, and there was one.
            got="$(sort -u "$d/processes.txt" 2>/dev/null)"
            if [ -n "$got" ] && ! grep -qvx "exe=$DESCRIPTOR" <<<"$(cut -d' ' -f1 <<<"$got")"; then
                result ok "${p}the daemon serving the share was $DESCRIPTOR" "$got"
            else
                result fail "${p}the daemon serving the share was $DESCRIPTOR" "${got:-no process served the share}"
            fi
        fi
    else
        result fail "${p}virsh create: libvirt started the daemon and QEMU" "$(cat "$d/create.txt")
the daemon's output (libvirt's $flog):
$(head -n 8 "$flog" 2>/dev/null | sed 's/^/  /')"
    fi
    [ -f "$d/argv.log" ] && sed "s/^/# ${p}libvirt ran: /" "$d/argv.log"
    for f in console.log domain.xml argv.log create.txt live.xml processes.txt; do [ -f "$d/$f" ] && cp "$d/$f" "$OUT/$name/"; done
    [ -f "$qlog" ] && cp "$qlog" "$OUT/$name/qemu.log"
    [ -f "$flog" ] && cp "$flog" "$OUT/$name/virtiofsd.log"
    if [ "$FAILED" -gt "$failed_before" ]; then
        show "${p}guest console, last lines" "$d/console.log" 25
        show "${p}libvirt's domain log" "$qlog" 12
        show "${p}virtiofsd log written by libvirt" "$flog" 25
        libvirtd_errors
    fi
}

for b in $BOOTS; do
    boot "$b"
done
finish
