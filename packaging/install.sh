#!/usr/bin/env bash
# Builds virtiofsd in release mode and installs it with its host integration files:
#
#   PREFIX/lib/virtiofsd                              the daemon
#   PREFIX/libexec/virtiofsd -> ../lib/virtiofsd      where Fedora's and Debian's packages put it
#   PREFIX/lib/qemu/virtiofsd -> ../virtiofsd         where older QEMU packages put it
#   PREFIX/share/qemu/vhost-user/50-virtiofsd.json    QEMU/libvirt vhost-user backend descriptor
#   PREFIX/lib/systemd/system/virtiofsd@.service      one daemon per share, socket-activated
#   PREFIX/lib/systemd/system/virtiofsd@.socket       /run/virtiofsd/INSTANCE.sock
#   PREFIX/share/man/man1/virtiofsd.1.gz              the manual page (doc/virtiofsd.1)
#   PREFIX/share/doc/virtiofsd/example.conf           sample /etc/virtiofsd/INSTANCE.conf
#
# Usage: packaging/install.sh [--prefix DIR] [--destdir DIR] [--no-build]
#                             [--compat-links yes|no]
#   --prefix DIR          installation prefix (default /usr); the unit files and the JSON
#                         descriptor name PREFIX/lib/virtiofsd
#   --destdir DIR         stage everything under DIR (as DESTDIR does for make install);
#                         the environment variable DESTDIR works too
#   --no-build            install the existing target/release/virtiofsd without cargo build
#   --compat-links MODE   yes (default): also make the two links above, so that domain XML
#                         and scripts naming the distributions' paths start this daemon; a
#                         file already there that is not a link (another package's daemon) is
#                         left alone, with a warning. no: only PREFIX/lib/virtiofsd.
#                         (--libexec-link auto|yes|no is the old name: auto means yes.)
# Nothing outside DESTDIR+PREFIX is touched; run systemctl daemon-reload yourself afterwards.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PREFIX=/usr
DESTDIR="${DESTDIR:-}"
BUILD=1
LINKS=yes

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX="$2"; shift 2 ;;
        --prefix=*) PREFIX="${1#*=}"; shift ;;
        --destdir) DESTDIR="$2"; shift 2 ;;
        --destdir=*) DESTDIR="${1#*=}"; shift ;;
        --no-build) BUILD=0; shift ;;
        --compat-links|--libexec-link) LINKS="$2"; shift 2 ;;
        --compat-links=*|--libexec-link=*) LINKS="${1#*=}"; shift ;;
        -h|--help) usage 0 ;;
        *) echo "install.sh: unknown option $1" >&2; usage 2 ;;
    esac
done
case "$PREFIX" in
    /*) PREFIX="${PREFIX%/}" ;;
    *) echo "install.sh: --prefix must be an absolute path" >&2; exit 2 ;;
esac
case "$LINKS" in
    auto|yes) LINKS=yes ;;
    no) ;;
    *) echo "install.sh: --compat-links takes yes or no" >&2; exit 2 ;;
esac
DESTDIR="${DESTDIR%/}"

if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --release --locked --bin virtiofsd)
fi
BIN="$ROOT/target/release/virtiofsd"
[ -x "$BIN" ] || { echo "install.sh: $BIN is missing (build it or drop --no-build)" >&2; exit 1; }

D="$DESTDIR$PREFIX"
DAEMON="$PREFIX/lib/virtiofsd"   # the path the installed files name

install -d -m 0755 "$D/lib" "$D/share/qemu/vhost-user" "$D/lib/systemd/system" \
    "$D/share/man/man1" "$D/share/doc/virtiofsd"
install -m 0755 "$BIN" "$D/lib/virtiofsd"
# link PATH TARGET: PATH (under D) becomes a relative symlink to TARGET, unless a file that is
# not a symlink is there already (another package's daemon): that one is left alone.
link() {
    if [ -e "$D/$1" ] && [ ! -L "$D/$1" ]; then
        echo "install.sh: warning: $PREFIX/$1 exists and is not a link; left alone (it, not this daemon, runs under that name)" >&2
        return 0
    fi
    install -d -m 0755 "$(dirname "$D/$1")"
    ln -sfn "$2" "$D/$1"
}
if [ "$LINKS" = yes ]; then
    link libexec/virtiofsd ../lib/virtiofsd
    link lib/qemu/virtiofsd ../virtiofsd
fi

# The files name /usr/lib/virtiofsd; another prefix is substituted in.
subst() { sed "s|/usr/lib/virtiofsd|$DAEMON|g" "$1"; }
subst "$ROOT/packaging/50-virtiofsd.json" > "$D/share/qemu/vhost-user/50-virtiofsd.json"
subst "$ROOT/packaging/virtiofsd@.service" > "$D/lib/systemd/system/virtiofsd@.service"
install -m 0644 "$ROOT/packaging/virtiofsd@.socket" "$D/lib/systemd/system/virtiofsd@.socket"
chmod 0644 "$D/share/qemu/vhost-user/50-virtiofsd.json" "$D/lib/systemd/system/virtiofsd@.service"
install -m 0644 "$ROOT/packaging/example.conf" "$D/share/doc/virtiofsd/example.conf"
# -n: no name or time stamp in the header, so that the output is reproducible.
gzip -9n -c "$ROOT/doc/virtiofsd.1" > "$D/share/man/man1/virtiofsd.1.gz"
chmod 0644 "$D/share/man/man1/virtiofsd.1.gz"

echo "installed virtiofsd under ${DESTDIR:-/} with prefix $PREFIX (compatibility links: $LINKS)"
if [ -z "$DESTDIR" ]; then
    echo "next: mkdir -p /etc/virtiofsd; cp $D/share/doc/virtiofsd/example.conf /etc/virtiofsd/NAME.conf;"
    echo "      systemctl daemon-reload; systemctl enable --now virtiofsd@NAME.socket"
fi
