#!/usr/bin/env bash
# shellcheck disable=SC2317 # the check functions are called through check()
# Packaging and host-integration checks: installs with packaging/install.sh into a temporary
# DESTDIR and checks what landed there; verifies the systemd units with `systemd-analyze
# verify` (no running systemd needed); renders the man page; parses the QEMU vhost-user
# descriptor; and starts the installed daemon with a socket from `systemd-socket-activate`, the
# way virtiofsd@.socket does, and talks vhost-user to it. Also checks the qemu-examples scripts
# with bash -n and shellcheck.
#
# Prints one "ok N name" / "not ok N name" line per check and a last line "N passed, N failed";
# exits non-zero when a check failed.
#
# Usage: tests/packaging.sh [--no-build] [--no-install-tools] [-v]
#   --no-build          use the existing target/release/virtiofsd (install.sh --no-build)
#   --no-install-tools  do not apt-get install the missing tools (packages systemd, groff-base,
#                       man-db, the shell linter, libvirt-clients and libxml2-utils for
#                       virt-xml-validate); checks that need them fail instead
#   -v, --verbose       also print the diagnostics of passing checks
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD=1
TOOLS=1
VERBOSE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) BUILD=0; shift ;;
        --no-install-tools) TOOLS=0; shift ;;
        -v|--verbose) VERBOSE=1; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "packaging.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/virtiofsd-packaging.XXXXXX")"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

N=0; PASSED=0; FAILED=0
# result ok|fail NAME [DIAG]
result() {
    N=$((N + 1))
    if [ "$1" = ok ]; then
        PASSED=$((PASSED + 1)); echo "ok $N $2"
    else
        FAILED=$((FAILED + 1)); echo "not ok $N $2"
    fi
    if [ -n "${3:-}" ] && { [ "$1" != ok ] || [ "$VERBOSE" = 1 ]; }; then
        printf '%s\n' "$3" | sed 's/^/# /'
    fi
}
# check NAME COMMAND...: ok when COMMAND succeeds; its output is the diagnostic
check() {
    local name="$1" out; shift
    if out="$("$@" 2>&1)"; then result ok "$name" "$out"; else result fail "$name" "$out"; fi
}
finish() {
    echo "$PASSED passed, $FAILED failed"
    [ "$FAILED" -eq 0 ]
    exit $?
}

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

BIN="$DEST/usr/lib/virtiofsd"
UNITS="$DEST/usr/lib/systemd/system"
JSON="$DEST/usr/share/qemu/vhost-user/50-virtiofsd.json"
MAN="$DEST/usr/share/man/man1/virtiofsd.1.gz"
CONF="$DEST/usr/share/doc/virtiofsd/example.conf"

layout() {
    local f want got bad=""
    for f in "usr/lib/virtiofsd 755" "usr/lib/systemd/system/virtiofsd@.service 644" \
             "usr/lib/systemd/system/virtiofsd@.socket 644" \
             "usr/share/qemu/vhost-user/50-virtiofsd.json 644" \
             "usr/share/man/man1/virtiofsd.1.gz 644" "usr/share/doc/virtiofsd/example.conf 644"; do
        want="${f#* }"; f="${f% *}"
        if [ ! -f "$DEST/$f" ]; then bad+="missing: /$f"$'\n'; continue; fi
        got="$(stat -c %a "$DEST/$f")"
        [ "$got" = "$want" ] || bad+="/$f: mode $got, expected $want"$'\n'
    done
    # nothing else: every regular file or link installed is one of the above
    got="$(cd "$DEST" && find . ! -type d | sort | tr '\n' ' ')"
    want="./usr/lib/qemu/virtiofsd ./usr/lib/systemd/system/virtiofsd@.service ./usr/lib/systemd/system/virtiofsd@.socket ./usr/lib/virtiofsd ./usr/libexec/virtiofsd ./usr/share/doc/virtiofsd/example.conf ./usr/share/man/man1/virtiofsd.1.gz ./usr/share/qemu/vhost-user/50-virtiofsd.json "
    [ "$got" = "$want" ] || bad+="installed files: $got"$'\n'"expected: $want"$'\n'
    [ -z "$bad" ] || { printf '%s' "$bad"; return 1; }
    echo "$got"
}
check "layout: files, modes, nothing else" layout

check "installed binary runs (--version)" "$BIN" --version
check "installed binary is target/release/virtiofsd" cmp "$BIN" "$ROOT/target/release/virtiofsd"

# The paths distributions install the daemon at, and the links that make them this daemon: each
# is a relative symlink that resolves inside the temporary root to usr/lib/virtiofsd, and runs.
compat_paths() {
    local p real
    for p in usr/libexec/virtiofsd usr/lib/qemu/virtiofsd; do
        [ -L "$DEST/$p" ] || { echo "/$p is not a symlink"; return 1; }
        case "$(readlink "$DEST/$p")" in /*) echo "/$p is an absolute link"; return 1 ;; esac
        real="$(cd "$DEST" && realpath --relative-to=. "$p")"
        [ "$real" = usr/lib/virtiofsd ] || { echo "/$p resolves to $real"; return 1; }
        "$DEST/$p" --version || return 1
        [ "$("$DEST/$p" --print-capabilities)" = "$("$BIN" --print-capabilities)" ] ||
            { echo "/$p --print-capabilities differs"; return 1; }
    done
    # --compat-links no: only /usr/lib/virtiofsd.
    "$ROOT/packaging/install.sh" --no-build --destdir "$WORK/nolinks" --compat-links no >/dev/null ||
        return 1
    [ ! -e "$WORK/nolinks/usr/libexec" ] && [ ! -e "$WORK/nolinks/usr/lib/qemu" ] ||
        { echo "--compat-links no made links"; return 1; }
    # A distribution's daemon already at one of the paths is left alone, with a warning.
    local d="$WORK/distro" out
    mkdir -p "$d/usr/libexec" && printf '#!/bin/sh\necho distro\n' > "$d/usr/libexec/virtiofsd"
    chmod 755 "$d/usr/libexec/virtiofsd"
    out="$("$ROOT/packaging/install.sh" --no-build --destdir "$d" 2>&1)" || return 1
    [ ! -L "$d/usr/libexec/virtiofsd" ] && [ "$("$d/usr/libexec/virtiofsd")" = distro ] ||
        { echo "the distribution's /usr/libexec/virtiofsd was replaced"; return 1; }
    printf '%s\n' "$out" | grep -q 'usr/libexec/virtiofsd exists and is not a link' ||
        { echo "no warning: $out"; return 1; }
    [ -L "$d/usr/lib/qemu/virtiofsd" ] || { echo "the other link is missing"; return 1; }
}
check "/usr/libexec/virtiofsd and /usr/lib/qemu/virtiofsd run the daemon; --compat-links no; a distribution's file is kept" compat_paths

prefix() {
    local d="$WORK/local" p
    "$ROOT/packaging/install.sh" --no-build --prefix /usr/local --destdir "$d" >/dev/null || return 1
    p="$d/usr/local"
    [ -x "$p/lib/virtiofsd" ] || { echo "no $p/lib/virtiofsd"; return 1; }
    grep -q '^ExecStart=/usr/local/lib/virtiofsd ' "$p/lib/systemd/system/virtiofsd@.service" ||
        { grep ExecStart "$p/lib/systemd/system/virtiofsd@.service"; return 1; }
    grep -q '"binary": "/usr/local/lib/virtiofsd"' "$p/share/qemu/vhost-user/50-virtiofsd.json" ||
        { cat "$p/share/qemu/vhost-user/50-virtiofsd.json"; return 1; }
    [ -f "$p/share/man/man1/virtiofsd.1.gz" ] || { echo "no man page under the prefix"; return 1; }
    [ "$(readlink "$p/libexec/virtiofsd")" = ../lib/virtiofsd ] || { echo "no libexec link under the prefix"; return 1; }
}
check "install.sh --prefix /usr/local names /usr/local/lib/virtiofsd in the units and JSON" prefix

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
if d.get("binary") != "/usr/lib/virtiofsd": errs.append("binary is %r" % d.get("binary"))
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
check "50-virtiofsd.json parses, type fs, binary is the installed daemon, features as --print-capabilities" json

# --- systemd units -----------------------------------------------------------------------------
units() {
    need systemd-analyze systemd || { echo "systemd-analyze missing"; return 1; }
    local u="$WORK/units" out
    mkdir -p "$u"
    cp "$UNITS"/virtiofsd@.service "$UNITS"/virtiofsd@.socket "$u/"
    # The installed daemon path, inside DESTDIR (verify checks that ExecStart is executable).
    sed -i "s|^ExecStart=/usr/lib/virtiofsd |ExecStart=$BIN |" "$u/virtiofsd@.service"
    grep -q "^ExecStart=$BIN " "$u/virtiofsd@.service" || { echo "ExecStart not rewritten"; return 1; }
    # MANPATH: Documentation=man:virtiofsd(1) must resolve to the installed page.
    # Any output (unknown keys, bad values) counts as a failure, not only the exit status.
    out="$(cd "$u" && MANPATH="$DEST/usr/share/man" SYSTEMD_LOG_COLOR=0 \
        systemd-analyze verify "$u/virtiofsd@share1.socket" "$u/virtiofsd@share1.service" 2>&1)"
    local rc=$?
    printf '%s\n' "$out"
    [ "$rc" = 0 ] && [ -z "$out" ]
}
check "systemd-analyze verify virtiofsd@share1.socket and .service" units

unit_content() {
    local s="$UNITS/virtiofsd@.service" k="$UNITS/virtiofsd@.socket" bad=""
    grep -qx 'EnvironmentFile=/etc/virtiofsd/%i.conf' "$s" || bad+="service: EnvironmentFile"$'\n'
    # shellcheck disable=SC2016 # systemd's ${VAR}, not the shell's
    grep -qx 'ExecStart=/usr/lib/virtiofsd --shared-dir=${SHARED_DIR} $VIRTIOFSD_OPTS' "$s" ||
        bad+="service: ExecStart: $(grep ExecStart= "$s")"$'\n'
    grep '^ExecStart=' "$s" | grep -qE -- '--socket-path|--socket|--fd' &&
        bad+="service names its own socket"$'\n'
    grep -qx 'ListenStream=/run/virtiofsd/%i.sock' "$k" || bad+="socket: ListenStream"$'\n'
    grep -qx 'SocketMode=0660' "$k" || bad+="socket: SocketMode"$'\n'
    grep -qx 'Accept=no' "$k" || bad+="socket: Accept"$'\n'
    grep -qx 'Service=virtiofsd@%i.service' "$k" || bad+="socket: Service"$'\n'
    [ -z "$bad" ] || { printf '%s' "$bad"; return 1; }
}
check "units: environment file, ExecStart without a socket, ListenStream/SocketMode/Accept" unit_content

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
check "man page renders without groff warnings; sections present; man -l shows it" manpage

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
check "man page describes exactly the long options of --help" man_options

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
    PIDS+=("$pid")
    out="$(python3 -c "$VHOST_CLIENT" "$sock" 2>&1)"; rc=$?
    echo "client: $out"
    [ "$rc" = 0 ] || { kill -TERM "$pid" 2>/dev/null; cat "$dir/daemon.log"; return 1; }
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"; wait "$pid"; echo "daemon still running 10 s after the disconnect"
        cat "$dir/daemon.log"; return 1
    fi
    wait "$pid"; rc=$?
    echo "daemon exit status $rc"; cat "$dir/daemon.log"
    [ "$rc" = 0 ] || return 1
    [ -S "$sock" ] || { echo "the daemon removed the activator's socket file"; return 1; }
}
check "systemd-socket-activate: example.conf options, activated socket, GET_FEATURES, exit 0" activation

two_sockets() {
    need systemd-socket-activate systemd || return 1
    local dir="$WORK/two" rc
    mkdir -p "$dir/share"
    systemd-socket-activate -l "$dir/a.sock" -l "$dir/b.sock" "$BIN" --shared-dir="$dir/share" \
        >"$dir/daemon.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.recv(1)' \
        "$dir/a.sock" 2>/dev/null &
    local cpid=$!
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { kill -TERM "$pid"; echo "daemon still running"; }
    wait "$pid"; rc=$?
    kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null
    cat "$dir/daemon.log"
    [ "$rc" = 2 ] && grep -q 'LISTEN_FDS' "$dir/daemon.log"
}
check "two activated sockets are refused (exit 2, message names LISTEN_FDS)" two_sockets

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
check "qemu-examples: bash -n and shellcheck clean, libvirt snippet is well-formed XML" examples

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
check "qemu-examples/libvirt-domain.xml validates against libvirt's domain schema" libvirt_schema

finish
