#!/usr/bin/env bash
# shellcheck disable=SC2317 # the check functions are called through check_cmd()
# Packaging and host-integration checks: installs with packaging/install.sh into a temporary
# DESTDIR and checks what landed there; verifies the systemd units with `systemd-analyze
# verify` (no running systemd needed); renders the man page; parses the QEMU vhost-user
# descriptor; and starts the installed daemon with a socket from `systemd-socket-activate`, the
# way virtiofsd@.socket does, and talks vhost-user to it. Also checks the qemu-examples scripts
# with bash -n and shellcheck.
#
# Then the Debian package (debian/): builds it with dpkg-buildpackage in a copy of the tree,
# checks it with lintian, installs it with `apt-get install ./virtiofsd-dropin_*.deb`, checks
# what it put on the host (the layout install.sh makes, the version, the man page, the
# descriptor, the units), has libvirt launch the installed daemon for a guest through the
# package's vhost-user descriptor (tests/libvirt/run.sh --descriptor), and purges the package
# again. That part needs root and dpkg, installs debhelper, dpkg-dev and lintian when missing,
# and refuses to start (a failed check) on a host where the package or Debian's virtiofsd is
# installed, or where files the package would take over exist: the host is left as found.
#
# Prints one "ok N name" / "not ok N name" line per check and a last line "N passed, N failed";
# exits non-zero when a check failed.
#
# Usage: tests/packaging.sh [--no-build] [--no-install-tools] [--no-deb] [--no-libvirt] [--keep] [-v]
#   --no-build          use the existing release binary (install.sh --no-build); the .deb is
#                       always built (in CARGO_TARGET_DIR/deb, default target/deb)
#   --no-install-tools  do not apt-get install the missing tools (packages systemd, groff-base,
#                       man-db, the shell linter, libvirt-clients and libxml2-utils for
#                       virt-xml-validate, debhelper, dpkg-dev, lintian); checks that need
#                       them fail instead
#   --no-deb            leave out the Debian package
#   --no-libvirt        leave out the libvirt boot with the installed package (it needs QEMU,
#                       the guest kernel and libvirt: tests/libvirt/run.sh installs them)
#   --keep              keep the work dir (the DESTDIR install, the .deb and its build log)
#   -v, --verbose       also print the diagnostics of passing checks
set -uo pipefail

# shellcheck source=tests/lib/common.sh
. "$(dirname "$0")/lib/common.sh"
TOOLS=1
DEB=1
LIBVIRT=1
while [ $# -gt 0 ]; do
    case "$1" in
        --no-install-tools) TOOLS=0; shift ;;
        --no-deb) DEB=0; shift ;;
        --no-libvirt) LIBVIRT=0; shift ;;
        --daemon|--daemon=*) bad_usage "--daemon: this level installs the tree's own build" ;;
        *) common_option "$@" || bad_usage "unknown option $1"; shift "$TAKEN" ;;
    esac
done

TARGET="$(target_dir)"
PKG=virtiofsd-dropin
work_dir virtiofsd-packaging
PURGE=0   # 1 while this script's package is installed
purge_early() {
    [ "$PURGE" = 1 ] || return 0
    echo "# purging $PKG (the run ended early)"
    DEBIAN_FRONTEND=noninteractive apt-get purge -y "$PKG" >/dev/null 2>&1
}
at_exit purge_early

# need COMMAND DEBIAN_PACKAGE: installs the package when the command is missing
need() {
    command -v "$1" >/dev/null && return 0
    if [ "$TOOLS" = 1 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "# installing $2 for $1"
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$2" \
            >"$WORK/apt-$2.log" 2>&1 ||
            { apt-get update >>"$WORK/apt-$2.log" 2>&1 &&
              DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$2" \
                  >>"$WORK/apt-$2.log" 2>&1; }
    fi
    command -v "$1" >/dev/null
}

# --- install into a DESTDIR --------------------------------------------------------------------
DEST="$WORK/dest"
flags=()
[ "$BUILD" = 0 ] && flags+=(--no-build)
if ! out="$("$ROOT/packaging/install.sh" "${flags[@]}" --destdir "$DEST" 2>&1)"; then
    result fail "install.sh --destdir into an empty directory" "$(printf '%s\n' "$out" | tail -n 20)"
    finish
fi
result ok "install.sh --destdir into an empty directory" "$out"

BIN="$DEST/usr/libexec/virtiofsd"
UNITS="$DEST/usr/lib/systemd/system"
JSON="$DEST/usr/share/qemu/vhost-user/50-qemu-virtiofsd.json"
MAN="$DEST/usr/share/man/man1/virtiofsd.1.gz"
DOCDIR="usr/share/doc/$PKG"
CONF="$DEST/$DOCDIR/example.conf"

# The files install.sh installs (relative to /, with their modes), and the Debian package too.
LAYOUT=("usr/libexec/virtiofsd 755" "usr/lib/systemd/system/virtiofsd@.service 644"
        "usr/lib/systemd/system/virtiofsd@.socket 644"
        "usr/share/qemu/vhost-user/50-qemu-virtiofsd.json 644"
        "usr/share/man/man1/virtiofsd.1.gz 644" "$DOCDIR/copyright 644" "$DOCDIR/example.conf 644"
        "$DOCDIR/README.md 644")
for f in "$ROOT"/doc/*.md; do LAYOUT+=("$DOCDIR/${f##*/} 644"); done

layout() {
    local f want got bad=""
    for f in "${LAYOUT[@]}"; do
        want="${f#* }"; f="${f% *}"
        if [ ! -f "$DEST/$f" ] || [ -L "$DEST/$f" ]; then bad+="missing: /$f"$'\n'; continue; fi
        got="$(stat -c %a "$DEST/$f")"
        [ "$got" = "$want" ] || bad+="/$f: mode $got, expected $want"$'\n'
    done
    # nothing else: every regular file or link installed is one of the above, or the link
    got="$(cd "$DEST" && find . ! -type d | sort | tr '\n' ' ')"
    want="$( { printf './%s\n' "${LAYOUT[@]% *}"; echo ./usr/lib/qemu/virtiofsd; echo ./usr/lib/virtiofsd; } | sort | tr '\n' ' ')"
    [ "$got" = "$want" ] || bad+="installed files: $got"$'\n'"expected: $want"$'\n'
    cmp -s "$DEST/$DOCDIR/copyright" "$ROOT/debian/copyright" || bad+="copyright is not debian/copyright"$'\n'
    [ -z "$bad" ] || { printf '%s' "$bad"; return 1; }
    echo "$got"
}
check_cmd "layout: files, modes, nothing else" layout

check_cmd "installed binary runs (--version)" "$BIN" --version
check_cmd "installed binary is the release build ($TARGET/release/virtiofsd)" cmp "$BIN" "$TARGET/release/virtiofsd"

# /usr/lib/qemu/virtiofsd, where older QEMU packages put the daemon, and /usr/lib/virtiofsd,
# the path this project's description launches and virtme-ng searches: relative symlinks that
# resolve inside the temporary root to usr/libexec/virtiofsd, and run.
compat_paths() {
    local p real
    for p in usr/lib/qemu/virtiofsd usr/lib/virtiofsd; do
        [ -L "$DEST/$p" ] || { echo "/$p is not a symlink"; return 1; }
        case "$(readlink "$DEST/$p")" in /*) echo "/$p is an absolute link"; return 1 ;; esac
        real="$(cd "$DEST" && realpath --relative-to=. "$p")"
        [ "$real" = usr/libexec/virtiofsd ] || { echo "/$p resolves to $real"; return 1; }
        "$DEST/$p" --version || return 1
        [ "$("$DEST/$p" --print-capabilities)" = "$("$BIN" --print-capabilities)" ] ||
            { echo "/$p --print-capabilities differs"; return 1; }
    done
    # --compat-links no: only /usr/libexec/virtiofsd.
    "$ROOT/packaging/install.sh" --no-build --destdir "$WORK/nolinks" --compat-links no >/dev/null ||
        return 1
    if [ ! -x "$WORK/nolinks/usr/libexec/virtiofsd" ] || [ -e "$WORK/nolinks/usr/lib/qemu" ] ||
        [ -e "$WORK/nolinks/usr/lib/virtiofsd" ]; then
        echo "--compat-links no: $(cd "$WORK/nolinks" && find . -name virtiofsd)"; return 1
    fi
}
check_cmd "/usr/lib/qemu/virtiofsd and /usr/lib/virtiofsd link to /usr/libexec/virtiofsd and run; --compat-links no" compat_paths

prefix() {
    local d="$WORK/local" p
    "$ROOT/packaging/install.sh" --no-build --prefix /usr/local --destdir "$d" >/dev/null || return 1
    p="$d/usr/local"
    [ -x "$p/libexec/virtiofsd" ] || { echo "no $p/libexec/virtiofsd"; return 1; }
    grep -q '^ExecStart=/usr/local/libexec/virtiofsd ' "$p/lib/systemd/system/virtiofsd@.service" ||
        { grep ExecStart "$p/lib/systemd/system/virtiofsd@.service"; return 1; }
    grep -q '"binary": "/usr/local/libexec/virtiofsd"' "$p/share/qemu/vhost-user/50-qemu-virtiofsd.json" ||
        { cat "$p/share/qemu/vhost-user/50-qemu-virtiofsd.json"; return 1; }
    [ -f "$p/share/man/man1/virtiofsd.1.gz" ] || { echo "no man page under the prefix"; return 1; }
    [ "$(readlink "$p/lib/qemu/virtiofsd")" = ../../libexec/virtiofsd ] || { echo "no lib/qemu link under the prefix"; return 1; }
    [ "$(readlink "$p/lib/virtiofsd")" = ../libexec/virtiofsd ] || { echo "no lib/virtiofsd link under the prefix"; return 1; }
}
check_cmd "install.sh --prefix /usr/local names /usr/local/libexec/virtiofsd in the units and JSON" prefix

# --- debian/copyright ---------------------------------------------------------------------------
# debian/copyright is what debian/gen-copyright makes from Cargo.lock now, and (checked apart
# from the script) names every crate linked into the daemon, on each Linux target the package
# is built for, with the license cargo reports, and has a License paragraph for each license.
copyright_crates() {
    "$ROOT/debian/gen-copyright" --check || return 1
    local c="$ROOT/debian/copyright" t p lic name ver id n=0 bad=""
    for t in x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu riscv64gc-unknown-linux-gnu; do
        (cd "$ROOT" && cargo tree --locked --package "$PKG" --target "$t" \
            --edges normal,no-proc-macro --prefix none --format '{p}|{l}') || return 1
    done | sed 's/ (\*)$//' | sort -u | grep -v "^$PKG " |
        grep -v '^[^|]* (/' >"$WORK/linked.txt" # not this tree's own crates (crates/fuse)
    while IFS='|' read -r p lic; do
        name="${p%% *}"; ver="${p#* v}"; ver="${ver%% *}"
        n=$((n + 1))
        grep -q "^ $name $ver: " "$c" || bad+="$name $ver is not named"$'\n'
        for id in $(tr '()/' '   ' <<<"$lic"); do
            case "$id" in OR|AND|WITH) continue ;; esac
            grep -qx "License: $id" "$c" || bad+="$name $ver: no 'License: $id' paragraph"$'\n'
        done
    done <"$WORK/linked.txt"
    [ "$n" -gt 20 ] || bad+="cargo tree listed only $n crates"$'\n'
    grep -q '^ nix [0-9.]*: MIT$' "$c" && grep -q '^ vmm-sys-util [0-9.]*: BSD-3-Clause$' "$c" ||
        bad+="nix (MIT) or vmm-sys-util (BSD-3-Clause) is missing"$'\n'
    [ -z "$bad" ] || { printf '%s' "$bad"; return 1; }
    echo "$n linked crates named with their licenses"
}
check_cmd "debian/copyright is debian/gen-copyright's, names every linked crate and has each license's text" copyright_crates

# --- the QEMU vhost-user descriptor ------------------------------------------------------------
json() {
    python3 -m json.tool "$JSON" >/dev/null || return 1
    python3 - "$JSON" "$DEST" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
errs = []
if d.get("type") != "fs": errs.append("type is %r, expected 'fs'" % d.get("type"))
if not isinstance(d.get("description"), str) or not d["description"]:
    errs.append("no description")
if d.get("binary") != "/usr/libexec/virtiofsd": errs.append("binary is %r" % d.get("binary"))
b = sys.argv[2] + d.get("binary", "")
if not os.access(b, os.X_OK): errs.append("%s is not executable" % b)
extra = set(d) - {"description", "type", "binary", "features", "tags"}
if extra: errs.append("unknown keys %s" % sorted(extra))
# The features are what the installed daemon prints with --print-capabilities, no more, no less.
import subprocess
caps = json.loads(subprocess.run([b, "--print-capabilities"], capture_output=True, check=True).stdout)
if d.get("features") != caps.get("features"):
    errs.append("features %r, but --print-capabilities says %r" % (d.get("features"), caps.get("features")))
print("\n".join(errs) or json.dumps(d))
sys.exit(1 if errs else 0)
PY
}
check_cmd "50-qemu-virtiofsd.json parses, type fs, binary is the installed daemon, features as --print-capabilities" json

# --- systemd units -----------------------------------------------------------------------------
units() {
    need systemd-analyze systemd || { echo "systemd-analyze missing"; return 1; }
    local u="$WORK/units" out
    mkdir -p "$u"
    cp "$UNITS"/virtiofsd@.service "$UNITS"/virtiofsd@.socket "$u/"
    # The installed daemon path, inside DESTDIR (verify checks that ExecStart is executable).
    sed -i "s|^ExecStart=/usr/libexec/virtiofsd |ExecStart=$BIN |" "$u/virtiofsd@.service"
    grep -q "^ExecStart=$BIN " "$u/virtiofsd@.service" || { echo "ExecStart not rewritten"; return 1; }
    # MANPATH: Documentation=man:virtiofsd(1) must resolve to the installed page.
    # Any output (unknown keys, bad values) counts as a failure, not only the exit status.
    out="$(cd "$u" && MANPATH="$DEST/usr/share/man" SYSTEMD_LOG_COLOR=0 \
        systemd-analyze verify "$u/virtiofsd@share1.socket" "$u/virtiofsd@share1.service" 2>&1)"
    local rc=$?
    printf '%s\n' "$out"
    [ "$rc" = 0 ] && [ -z "$out" ]
}
check_cmd "systemd-analyze verify virtiofsd@share1.socket and .service" units

# The service's hardening, as systemd scores it (9.6 "UNSAFE" without any; 5.3 with the unit's:
# what is left out is said why in the unit). tests/it/sandbox.rs runs the daemon with the unit's
# capability bounding set.
unit_security() {
    need systemd-analyze systemd || return 1
    local out level
    out="$(SYSTEMD_LOG_COLOR=0 systemd-analyze security --offline=yes --no-pager \
        "$WORK/units/virtiofsd@.service" 2>&1)"
    level="$(sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p' <<<"$out")"
    printf '%s\n' "$out" | grep -E '^(✗|→)' | head -n 40
    [ -n "$level" ] && awk -v l="$level" 'BEGIN { exit !(l <= 5.5) }'
}
check_cmd "systemd-analyze security: the service's exposure is at most 5.5" unit_security

unit_content() {
    local s="$UNITS/virtiofsd@.service" k="$UNITS/virtiofsd@.socket" bad=""
    grep -qx 'EnvironmentFile=/etc/virtiofsd/%i.conf' "$s" || bad+="service: EnvironmentFile"$'\n'
    # shellcheck disable=SC2016 # systemd's ${VAR}, not the shell's
    grep -qx 'ExecStart=/usr/libexec/virtiofsd --shared-dir=${SHARED_DIR} $VIRTIOFSD_OPTS' "$s" ||
        bad+="service: ExecStart: $(grep ExecStart= "$s")"$'\n'
    grep '^ExecStart=' "$s" | grep -qE -- '--socket-path|--socket|--fd' &&
        bad+="service names its own socket"$'\n'
    grep -qx 'ListenStream=/run/virtiofsd/%i.sock' "$k" || bad+="socket: ListenStream"$'\n'
    grep -qx 'SocketMode=0660' "$k" || bad+="socket: SocketMode"$'\n'
    grep -qx 'Accept=no' "$k" || bad+="socket: Accept"$'\n'
    grep -qx 'Service=virtiofsd@%i.service' "$k" || bad+="socket: Service"$'\n'
    [ -z "$bad" ] || { printf '%s' "$bad"; return 1; }
}
check_cmd "units: environment file, ExecStart without a socket, ListenStream/SocketMode/Accept" unit_content

# --- man page ----------------------------------------------------------------------------------
manpage() {
    need groff groff-base || { echo "groff missing"; return 1; }
    local warn text
    # -ww: every warning; -z: no output. Warnings mean a broken page.
    warn="$(zcat "$MAN" | groff -man -Tutf8 -ww -z 2>&1)"
    [ -z "$warn" ] || { printf '%s\n' "$warn"; return 1; }
    text="$(zcat "$MAN" | groff -man -Tutf8 -P-c 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g; s/.\x08//g')"
    local s
    for s in NAME SYNOPSIS DESCRIPTION OPTIONS "SOCKET ACTIVATION" "EXIT STATUS" EXAMPLES FILES "SEE ALSO"; do
        printf '%s\n' "$text" | grep -qx "$s" || { echo "section $s missing"; return 1; }
    done
    if need man man-db; then
        MANWIDTH=200 man -l "$MAN" 2>&1 | grep -qE 'virtiofsd +- +vhost-user +virtio-fs +daemon' ||
            { echo "man -l does not show the NAME line"; return 1; }
    fi
    echo "$(printf '%s\n' "$text" | wc -l) lines"
}
check_cmd "man page renders without groff warnings; sections present; man -l shows it" manpage

# Every long option the daemon's --help lists is described in the man page, and the man page
# describes no option the daemon does not have.
man_options() {
    local help page missing="" extra="" o
    help="$("$BIN" --help | grep -oE '^ +(-[a-zA-Z], )?--[a-z0-9-]+' | grep -oE -- '--[a-z0-9-]+' | sort -u)"
    page="$(zcat "$MAN" | groff -man -Tutf8 -P-c 2>/dev/null | sed 's/.\x08//g' |
        grep -oE '^ {7}(-[a-zA-Z], )?--[a-z0-9-]+' | grep -oE -- '--[a-z0-9-]+' | sort -u)"
    for o in $help; do printf '%s\n' "$page" | grep -qx -- "$o" || missing+=" $o"; done
    for o in $page; do printf '%s\n' "$help" | grep -qx -- "$o" || extra+=" $o"; done
    [ -z "$missing$extra" ] || {
        [ -n "$missing" ] && echo "in --help, not in the man page:$missing"
        [ -n "$extra" ] && echo "in the man page, not in --help:$extra"
        return 1
    }
    echo "$(printf '%s\n' "$help" | wc -l) options"
}
check_cmd "man page describes exactly the long options of --help" man_options

# --- socket activation with systemd-socket-activate --------------------------------------------
# The daemon as virtiofsd@share1.service runs it: options from example.conf, socket from the
# activator (LISTEN_FDS=1, descriptor 3), no --socket-path. A small vhost-user client connects
# (which starts the daemon), asks GET_FEATURES, checks the answer and hangs up; the daemon must
# then exit 0 and leave the socket file (the activator's) in place.
VHOST_CLIENT='
import socket, struct, sys, time
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
deadline = time.time() + 10
while True:
    try:
        s.connect(path); break
    except OSError:
        if time.time() > deadline: raise
        time.sleep(0.05)
s.settimeout(10)
s.sendall(struct.pack("<III", 1, 0x1, 0))          # VHOST_USER_GET_FEATURES, version 1
buf = b""
while len(buf) < 20:
    chunk = s.recv(20 - len(buf))
    if not chunk: sys.exit("connection closed after %d bytes" % len(buf))
    buf += chunk
req, flags, size = struct.unpack("<III", buf[:12])
(features,) = struct.unpack("<Q", buf[12:20])
print("reply request=%d flags=%#x size=%d features=%#x" % (req, flags, size, features))
ok = req == 1 and flags & 0x4 and size == 8 and features >> 30 & 1 and features >> 32 & 1
s.close()
sys.exit(0 if ok else "not a GET_FEATURES reply with PROTOCOL_FEATURES and VERSION_1")
'
activation() {
    need systemd-socket-activate systemd || { echo "systemd-socket-activate missing"; return 1; }
    local dir="$WORK/act" sock="$WORK/act/share1.sock" pid rc out
    mkdir -p "$dir/share"
    # The sample configuration read as systemd reads an EnvironmentFile (VAR=value lines, the
    # value unquoted), with the share pointed at a temporary directory.
    local SHARED_DIR="" VIRTIOFSD_OPTS="" k v
    while IFS='=' read -r k v; do
        case "$k" in
            SHARED_DIR) SHARED_DIR="$v" ;;
            VIRTIOFSD_OPTS) VIRTIOFSD_OPTS="$v" ;;
        esac
    done < <(grep -vE '^[[:space:]]*(#|$)' "$CONF")
    [ -n "$SHARED_DIR" ] || { echo "example.conf sets no SHARED_DIR"; return 1; }
    [ -n "$VIRTIOFSD_OPTS" ] || { echo "example.conf sets no VIRTIOFSD_OPTS"; return 1; }
    echo "example.conf: SHARED_DIR=$SHARED_DIR VIRTIOFSD_OPTS=$VIRTIOFSD_OPTS"
    SHARED_DIR="$dir/share"
    # shellcheck disable=SC2086 # split like systemd's $VIRTIOFSD_OPTS
    systemd-socket-activate -l "$sock" "$BIN" --shared-dir="$SHARED_DIR" $VIRTIOFSD_OPTS \
        >"$dir/daemon.log" 2>&1 &
    pid=$!
    track "$pid"
    out="$(python3 -c "$VHOST_CLIENT" "$sock" 2>&1)"; rc=$?
    echo "client: $out"
    [ "$rc" = 0 ] || { kill_tree "$pid" TERM; cat "$dir/daemon.log"; return 1; }
    reap "$pid" 10
    rc="$REAPED"
    if [ "$rc" = running ]; then
        echo "daemon still running 10 s after the disconnect"
        cat "$dir/daemon.log"; return 1
    fi
    echo "daemon exit status $rc"; cat "$dir/daemon.log"
    [ "$rc" = 0 ] || return 1
    [ -S "$sock" ] || { echo "the daemon removed the activator's socket file"; return 1; }
}
check_cmd "systemd-socket-activate: example.conf options, activated socket, GET_FEATURES, exit 0" activation

two_sockets() {
    need systemd-socket-activate systemd || return 1
    local dir="$WORK/two" rc
    mkdir -p "$dir/share"
    systemd-socket-activate -l "$dir/a.sock" -l "$dir/b.sock" "$BIN" --shared-dir="$dir/share" \
        >"$dir/daemon.log" 2>&1 &
    local pid=$!
    track "$pid"
    python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.recv(1)' \
        "$dir/a.sock" 2>/dev/null &
    local cpid=$!
    track "$cpid"
    reap "$pid" 10
    rc="$REAPED"
    [ "$rc" = running ] && echo "daemon still running"
    reap "$cpid" 0
    cat "$dir/daemon.log"
    [ "$rc" = 2 ] && grep -q 'LISTEN_FDS' "$dir/daemon.log"
}
check_cmd "two activated sockets are refused (exit 2, message names LISTEN_FDS)" two_sockets

# --- qemu-examples -----------------------------------------------------------------------------
examples() {
    local f out bad=""
    need shellcheck shellcheck || { echo "shellcheck missing"; return 1; }
    for f in "$ROOT"/qemu-examples/*.sh; do
        out="$(bash -n "$f" 2>&1 && shellcheck -x "$f" 2>&1)" || bad+="$f:"$'\n'"$out"$'\n'
        [ "${f##*/}" = common.sh ] || [ -x "$f" ] || bad+="$f is not executable"$'\n'
    done
    python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' \
        "$ROOT/qemu-examples/libvirt-domain.xml" 2>&1 || bad+="libvirt-domain.xml does not parse"$'\n'
    [ -z "$bad" ] || { printf '%s' "$bad"; return 1; }
    ls "$ROOT"/qemu-examples/
}
check_cmd "qemu-examples: bash -n and shellcheck clean, libvirt snippet is well-formed XML" examples

# The libvirt snippet, made a whole domain (a name, memory and an OS type added), against
# libvirt's own schema: libvirt refuses what its schema does not allow (<cache mode='auto'/>
# once did not validate: libvirt takes none and always only).
libvirt_schema() {
    need virt-xml-validate libvirt-clients || { echo "virt-xml-validate missing"; return 1; }
    need xmllint libxml2-utils || { echo "xmllint missing"; return 1; }
    python3 - "$ROOT/qemu-examples/libvirt-domain.xml" "$WORK/domain.xml" <<'PY' || return 1
import sys
s = open(sys.argv[1]).read()
head = "<domain type='kvm'>"
if head not in s:
    sys.exit("no " + head)
s = s.replace(head, head + "<name>example</name><memory unit='MiB'>512</memory>"
              "<os><type>hvm</type></os>", 1)
open(sys.argv[2], "w").write(s)
PY
    virt-xml-validate "$WORK/domain.xml" domain 2>&1
}
check_cmd "qemu-examples/libvirt-domain.xml validates against libvirt's domain schema" libvirt_schema

# --- the Debian package ------------------------------------------------------------------------
[ "$DEB" = 1 ] || finish

# The version the package must carry: Cargo.toml's, with Debian revision 1 or more.
CARGO_VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)"
ARCH="$(dpkg --print-architecture 2>/dev/null)"
DEBS="$WORK/deb"    # dpkg-buildpackage writes the .deb next to the source tree's copy
DEBFILE=""   # set after the build (each check runs in a subshell)

# Paths the package installs; with a package of its own (a distribution's virtiofsd, QEMU 7.2's
# qemu-system-common) or an unowned file (an install.sh run) at one of them, the run stops:
# installing and purging the package would change the host.
host_is_clean() {
    local bad="" p st v
    [ "$(id -u)" = 0 ] || { echo "needs root (apt-get install)"; return 1; }
    command -v apt-get >/dev/null && command -v dpkg >/dev/null || { echo "needs apt and dpkg"; return 1; }
    for p in "$PKG" virtiofsd; do
        st="$(dpkg-query -W -f='${db:Status-Status} ${Version}' "$p" 2>/dev/null)"
        case "$st" in installed*|unpacked*|half-*|triggers-*)
            bad+="package $p is installed (${st#* }): remove it first (apt purge $p)"$'\n' ;;
        esac
    done
    v="$(dpkg-query -W -f='${db:Status-Status} ${Version}' qemu-system-common 2>/dev/null)"
    if [ "${v%% *}" = installed ] && dpkg --compare-versions "${v#* }" lt 1:8.0~; then
        bad+="qemu-system-common ${v#* } ships a virtiofsd the package would take over"$'\n'
    fi
    for p in /usr/libexec/virtiofsd /usr/lib/qemu/virtiofsd /usr/lib/virtiofsd \
             /usr/share/qemu/vhost-user/50-qemu-virtiofsd.json \
             /usr/lib/systemd/system/virtiofsd@.service /usr/lib/systemd/system/virtiofsd@.socket \
             /usr/share/man/man1/virtiofsd.1.gz "/usr/share/doc/$PKG"; do
        [ -e "$p" ] || [ -L "$p" ] && bad+="$p exists (not from this run)"$'\n'
    done
    [ -z "$bad" ] || { printf '%s' "$bad"; return 1; }
    echo "no $PKG, no virtiofsd package, none of the package's paths on the host"
}
if ! check_cmd "host has nothing the package would replace (it is installed and purged again)" host_is_clean; then
    finish
fi

build_deb() {
    need dpkg-buildpackage dpkg-dev || { echo "dpkg-buildpackage missing"; return 1; }
    need dh debhelper || { echo "debhelper missing"; return 1; }
    local src="$DEBS/src" out
    mkdir -p "$src"
    # A copy of the tree (git's files, committed or not, or everything but target/), so that
    # the build leaves nothing in the checkout; cargo builds in its own target directory.
    if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        (cd "$ROOT" && git ls-files -z -co --exclude-standard | tar -cf - --null -T -) | tar -xf - -C "$src"
    else
        tar -C "$ROOT" --exclude=./target -cf - . | tar -xf - -C "$src"
    fi
    # -d: the toolchain is rustup's (Build-Depends names Debian's cargo and rustc, which dpkg
    # would look for); -b: binary packages only.
    if ! (cd "$src" && CARGO_TARGET_DIR="$TARGET/deb" dpkg-buildpackage -us -uc -b -d) \
            >"$DEBS/build.log" 2>&1; then
        tail -n 30 "$DEBS/build.log"; return 1
    fi
    local deb
    deb="$DEBS/${PKG}_$(cd "$src" && dpkg-parsechangelog -S Version)_${ARCH}.deb"
    [ -f "$deb" ] || { echo "no $deb:"; ls "$DEBS"; return 1; }
    out="$(dpkg-deb -f "$deb" Package Version Architecture Provides Conflicts Replaces)"
    echo "$out"
    # The upstream part of the version is Cargo.toml's.
    grep -qx "Version: $CARGO_VERSION-[0-9][0-9.]*" <<<"$out" ||
        { echo "the package's version is not $CARGO_VERSION-N"; return 1; }
    grep -qx 'Provides: virtiofsd (= 1\.[0-9]*\.[0-9]*)' <<<"$out" &&
        grep -qx 'Conflicts: virtiofsd' <<<"$out" || { echo "no Provides/Conflicts: virtiofsd"; return 1; }
}
check_cmd "dpkg-buildpackage -us -uc -b builds ${PKG}_${CARGO_VERSION}-N_${ARCH}.deb" build_deb
for f in "$DEBS/${PKG}_"*"_${ARCH}.deb"; do [ -f "$f" ] && DEBFILE="$f"; done
[ -n "$DEBFILE" ] || finish

lint() {
    need lintian lintian || { echo "lintian missing"; return 1; }
    # Every tag fails, down to info, pedantic and experimental ones (-E --pedantic): the
    # package's overrides say why each one left is wrong.
    lintian -E --pedantic -I --fail-on error,warning,info,pedantic,experimental \
        "$DEBS/${PKG}_"*"_${ARCH}.changes" 2>&1
}
check_cmd "lintian -E --pedantic: no tag but the package's overrides" lint

install_deb() {
    local out
    out="$(DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$DEBFILE" 2>&1)"
    local rc=$?
    printf '%s\n' "$out" | tail -n 5
    [ "$rc" = 0 ] && dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null | grep -qx installed
}
PURGE=1   # from here on, an early end purges the package (it was not installed before)
if ! check_cmd "apt-get install ./${DEBFILE##*/}" install_deb; then
    finish
fi

# What the package put on the host: install.sh's layout (documents gzipped where Debian
# compresses them) with the same contents, and besides only the changelogs and crates.txt in
# the documentation directory and lintian's overrides.
deb_layout() {
    local bad="" f mode p src got listed allowed="" extra=""
    listed="$(dpkg -L "$PKG" | sort)"
    for f in "${LAYOUT[@]}"; do
        mode="${f#* }"; f="${f% *}"
        allowed+="/$f"$'\n'"/$f.gz"$'\n'
        if [ -f "/$f" ]; then p="/$f"; elif [ -f "/$f.gz" ]; then p="/$f.gz"; else bad+="missing: /$f"$'\n'; continue; fi
        grep -qx "$p" <<<"$listed" || bad+="$p is not the package's"$'\n'
        got="$(stat -c %a "$p")"
        [ "$got" = "$mode" ] || bad+="$p: mode $got, expected $mode"$'\n'
        src="$DEST/$f"
        case "$p" in
            /usr/libexec/virtiofsd) ;;   # built apart, with line tables for -dbgsym: --version below
            *.gz) if [ "${f##*.}" = gz ]; then cmp -s <(zcat "$p") <(zcat "$src"); else cmp -s <(zcat "$p") "$src"; fi ||
                      bad+="$p differs from install.sh's"$'\n' ;;
            *) cmp -s "$p" "$src" || bad+="$p differs from install.sh's"$'\n' ;;
        esac
    done
    [ "$(readlink /usr/lib/qemu/virtiofsd)" = ../../libexec/virtiofsd ] ||
        bad+="/usr/lib/qemu/virtiofsd -> $(readlink /usr/lib/qemu/virtiofsd)"$'\n'
    [ "$(readlink /usr/lib/virtiofsd)" = ../libexec/virtiofsd ] ||
        bad+="/usr/lib/virtiofsd -> $(readlink /usr/lib/virtiofsd)"$'\n'
    allowed+="/usr/lib/qemu/virtiofsd"$'\n'"/usr/lib/virtiofsd"
    # Files (not directories) the package has beyond install.sh's layout.
    while read -r f; do
        [ -d "$f" ] && [ ! -L "$f" ] && continue
        grep -qxF "$f" <<<"$allowed" || extra+="$f "
    done <<<"$listed"
    [ "$extra" = "/$DOCDIR/changelog.Debian.gz /$DOCDIR/changelog.gz /$DOCDIR/crates.txt /usr/share/lintian/overrides/$PKG " ] ||
        bad+="files beyond install.sh's layout: $extra"$'\n'
    grep -q '^clap v' "/$DOCDIR/crates.txt" || bad+="crates.txt lists no clap"$'\n'
    [ -z "$bad" ] || { printf '%s' "$bad"; return 1; }
    echo "$listed"
}
check_cmd "installed: install.sh's layout and contents, plus changelogs, crates.txt, lintian overrides" deb_layout

deb_version() {
    local v want
    v="$(/usr/libexec/virtiofsd --version)" || return 1
    want="virtiofsd $("$TARGET/release/virtiofsd" --version | sed 's/^virtiofsd //')"
    echo "$v"
    [ "$v" = "$want" ] || { echo "expected $want"; return 1; }
    grep -Eqx "virtiofsd 1\.[0-9]+\.[0-9]+\+$PKG\.$CARGO_VERSION" <<<"$v" &&
        [ "$(/usr/lib/qemu/virtiofsd --version)" = "$v" ] && [ "$(/usr/lib/virtiofsd --version)" = "$v" ]
}
check_cmd "/usr/libexec/virtiofsd --version (and /usr/lib/qemu/virtiofsd's, /usr/lib/virtiofsd's) names the reference release and $PKG $CARGO_VERSION" deb_version

deb_man() {
    need man man-db || return 1
    [ "$(man -w virtiofsd)" = /usr/share/man/man1/virtiofsd.1.gz ] || { man -w -a virtiofsd; return 1; }
    MANWIDTH=200 man virtiofsd 2>&1 | grep -E "$PKG +$CARGO_VERSION" | head -n 1 | grep . ||
        { echo "the page's footer names no $PKG $CARGO_VERSION"; return 1; }
}
check_cmd "man virtiofsd shows the installed page of $PKG $CARGO_VERSION" deb_man

deb_copyright() {
    local c="/$DOCDIR/copyright" bad=""
    head -n 1 "$c" | grep -qx 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' ||
        bad+="no DEP-5 Format line"$'\n'
    grep -qx 'Upstream-Name: virtiofsd-dropin' "$c" || bad+="no Upstream-Name"$'\n'
    # The license of Cargo.toml, as a DEP-5 expression, on the Files: * paragraph.
    grep -A2 -x 'Files: \*' "$c" | grep -qx 'License: Apache-2.0 or BSD-3-Clause' ||
        bad+="Files: * is not Apache-2.0 or BSD-3-Clause"$'\n'
    grep -qx 'license = "Apache-2.0 OR BSD-3-Clause"' "$ROOT/Cargo.toml" || bad+="Cargo.toml says another license"$'\n'
    grep -qx 'License: Apache-2.0' "$c" && grep -qx 'License: BSD-3-Clause' "$c" ||
        bad+="a license paragraph is missing"$'\n'
    [ -z "$bad" ] || { printf '%s' "$bad"; return 1; }
    head -n 3 "$c"
}
check_cmd "/$DOCDIR/copyright is machine-readable (DEP-5), Apache-2.0 or BSD-3-Clause" deb_copyright

deb_units() {
    need systemd-analyze systemd || return 1
    local out
    # The installed units as installed: ExecStart names /usr/libexec/virtiofsd, which exists.
    out="$(SYSTEMD_LOG_COLOR=0 systemd-analyze verify virtiofsd@share1.socket virtiofsd@share1.service 2>&1)"
    local rc=$?
    printf '%s\n' "$out"
    [ "$rc" = 0 ] && [ -z "$out" ]
}
check_cmd "systemd-analyze verify: the installed virtiofsd@share1.socket and .service" deb_units

# The package's descriptor names the installed daemon, which lists what it says.
deb_descriptor() {
    python3 - /usr/share/qemu/vhost-user/50-qemu-virtiofsd.json <<'PY'
import json, subprocess, sys
d = json.load(open(sys.argv[1]))
caps = json.loads(subprocess.run([d["binary"], "--print-capabilities"], capture_output=True, check=True).stdout)
ok = d["type"] == "fs" and d["binary"] == "/usr/libexec/virtiofsd" and d["features"] == caps["features"]
print(json.dumps(d))
sys.exit(0 if ok else 1)
PY
}
check_cmd "installed 50-qemu-virtiofsd.json: type fs, binary /usr/libexec/virtiofsd, its --print-capabilities" deb_descriptor

# install.sh does not write over the package's files.
install_sh_refuses() {
    local before out rc
    before="$(sha256sum /usr/libexec/virtiofsd)"
    out="$("$ROOT/packaging/install.sh" --no-build 2>&1)"; rc=$?
    echo "exit $rc: $out"
    [ "$rc" = 1 ] && grep -q "/usr/libexec/virtiofsd (package $PKG)" <<<"$out" &&
        [ "$(sha256sum /usr/libexec/virtiofsd)" = "$before" ]
}
check_cmd "install.sh into / refuses the package's files (exit 1) and changes nothing" install_sh_refuses

# libvirt launches the installed daemon for a guest: the domain has no <binary path>, libvirt
# finds the daemon through the package's /usr/share/qemu/vhost-user/50-qemu-virtiofsd.json.
deb_libvirt() {
    local out rc
    out="$("$ROOT/tests/libvirt/run.sh" --descriptor /usr/libexec/virtiofsd --boot plain 2>&1)"; rc=$?
    printf '%s\n' "$out" | grep -E '^(ok|not ok|#   |# ---)' | head -n 40
    [ "$rc" = 0 ] && grep -q '^ok .*the daemon serving the share was /usr/libexec/virtiofsd' <<<"$out"
}
if [ "$LIBVIRT" = 1 ]; then
    check_cmd "libvirt starts the installed /usr/libexec/virtiofsd from the package's descriptor; a guest mounts and writes the share" deb_libvirt
fi

purge_deb() {
    local out p left=""
    out="$(DEBIAN_FRONTEND=noninteractive apt-get purge -y "$PKG" 2>&1)" || { printf '%s\n' "$out" | tail -n 5; return 1; }
    dpkg-query -W -f='${db:Status-Status}' "$PKG" 2>/dev/null | grep -q installed && left+="still installed"$'\n'
    for p in /usr/libexec/virtiofsd /usr/lib/qemu/virtiofsd /usr/lib/virtiofsd \
             /usr/share/qemu/vhost-user/50-qemu-virtiofsd.json \
             /usr/lib/systemd/system/virtiofsd@.service /usr/share/man/man1/virtiofsd.1.gz "/$DOCDIR"; do
        [ -e "$p" ] || [ -L "$p" ] && left+="$p is left"$'\n'
    done
    [ -z "$left" ] || { printf '%s' "$left"; return 1; }
    echo "purged; none of its files left"
}
check_cmd "apt-get purge $PKG leaves none of its files" purge_deb &&
    PURGE=0

finish
