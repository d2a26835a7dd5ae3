#!/usr/bin/env bash
# Builds virtiofsd in release mode and installs it with its host integration files, in the
# layout of the Debian package (debian/, built by tests/packaging.sh), for systems without it:
#
#   PREFIX/libexec/virtiofsd                             the daemon (where Debian and Fedora put it)
#   PREFIX/lib/qemu/virtiofsd -> ../../libexec/virtiofsd where older QEMU packages put it
#   PREFIX/lib/virtiofsd -> ../libexec/virtiofsd         the path launchers such as virtme-ng
#                                                        also look at
#   PREFIX/share/qemu/vhost-user/50-qemu-virtiofsd.json  QEMU/libvirt vhost-user backend descriptor
#   PREFIX/lib/systemd/system/virtiofsd@.service         one daemon per share, socket-activated
#   PREFIX/lib/systemd/system/virtiofsd@.socket          /run/virtiofsd/INSTANCE.sock
#   PREFIX/share/man/man1/virtiofsd.1.gz                 the manual page (doc/virtiofsd.1)
#   PREFIX/share/doc/virtiofsd-dropin/                   copyright, example.conf (a sample
#                                                        /etc/virtiofsd/INSTANCE.conf),
#                                                        README.md and doc/*.md
#
# Usage: packaging/install.sh [--prefix DIR] [--destdir DIR] [--no-build]
#                             [--compat-links yes|no] [--force]
#   --prefix DIR          installation prefix (default /usr); the unit files and the JSON
#                         descriptor name PREFIX/libexec/virtiofsd
#   --destdir DIR         stage everything under DIR (as DESTDIR does for make install);
#                         the environment variable DESTDIR works too
#   --no-build            install the existing release binary without cargo build
#                         (CARGO_TARGET_DIR/release/virtiofsd, default target/release/virtiofsd)
#   --compat-links MODE   yes (default): also make the links PREFIX/lib/qemu/virtiofsd and
#                         PREFIX/lib/virtiofsd, so that domain XML, launchers and scripts
#                         naming those paths start this daemon. no: leave them out.
#                         (--libexec-link auto|yes|no is the old name: auto means yes.)
#   --force               install over files that an installed package (dpkg or rpm) owns
# Without DESTDIR, a file of an installed package (a distribution's virtiofsd, or the
# virtiofsd-dropin .deb) at one of these paths stops the installation (exit 1) before anything
# is written: remove the package, install the .deb instead, or use --prefix /usr/local.
# Nothing outside DESTDIR+PREFIX is touched; run systemctl daemon-reload yourself afterwards.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PKG=virtiofsd-dropin
PREFIX=/usr
DESTDIR="${DESTDIR:-}"
BUILD=1
LINKS=yes
FORCE=0

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
        --force) FORCE=1; shift ;;
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

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --release --locked --bin virtiofsd)
fi
BIN="$TARGET/release/virtiofsd"
[ -x "$BIN" ] || { echo "install.sh: $BIN is missing (build it or drop --no-build)" >&2; exit 1; }

D="$DESTDIR$PREFIX"
DAEMON="$PREFIX/libexec/virtiofsd"   # the path the installed files name
DOC="share/doc/$PKG"

# Every path installed, relative to PREFIX.
FILES=(libexec/virtiofsd share/qemu/vhost-user/50-qemu-virtiofsd.json
       lib/systemd/system/virtiofsd@.service lib/systemd/system/virtiofsd@.socket
       share/man/man1/virtiofsd.1.gz "$DOC/copyright" "$DOC/example.conf" "$DOC/README.md")
for f in "$ROOT"/doc/*.md; do FILES+=("$DOC/${f##*/}"); done
[ "$LINKS" = yes ] && FILES+=(lib/qemu/virtiofsd lib/virtiofsd)

# A package's file is not overwritten behind the package manager's back.
if [ -z "$DESTDIR" ] && [ "$FORCE" = 0 ]; then
    owned=""
    for f in "${FILES[@]}"; do
        p="$D/$f"
        [ -e "$p" ] || [ -L "$p" ] || continue
        o=""
        if command -v dpkg-query >/dev/null; then
            o="$(dpkg-query -S "$p" 2>/dev/null | sed -n '1s/: .*//p')"
        fi
        if [ -z "$o" ] && command -v rpm >/dev/null; then
            o="$(rpm -qf "$p" 2>/dev/null)" || o=""
        fi
        [ -n "$o" ] && owned+="  $p (package $o)"$'\n'
    done
    if [ -n "$owned" ]; then
        printf 'install.sh: these files belong to an installed package:\n%s' "$owned" >&2
        echo "install.sh: nothing installed; remove that package, or use --prefix /usr/local, or --force" >&2
        exit 1
    fi
fi

install -d -m 0755 "$D/libexec" "$D/share/qemu/vhost-user" "$D/lib/systemd/system" \
    "$D/share/man/man1" "$D/$DOC"
install -m 0755 "$BIN" "$D/libexec/virtiofsd"
if [ "$LINKS" = yes ]; then
    install -d -m 0755 "$D/lib/qemu"
    ln -sfn ../../libexec/virtiofsd "$D/lib/qemu/virtiofsd"
    ln -sfn ../libexec/virtiofsd "$D/lib/virtiofsd"
fi

# The files name /usr/libexec/virtiofsd; another prefix is substituted in.
subst() { sed "s|/usr/libexec/virtiofsd|$DAEMON|g" "$1" > "$2" && chmod 0644 "$2"; }
subst "$ROOT/packaging/50-qemu-virtiofsd.json" "$D/share/qemu/vhost-user/50-qemu-virtiofsd.json"
subst "$ROOT/packaging/virtiofsd@.service" "$D/lib/systemd/system/virtiofsd@.service"
install -m 0644 "$ROOT/packaging/virtiofsd@.socket" "$D/lib/systemd/system/virtiofsd@.socket"
# -n: no name or time stamp in the header, so that the output is reproducible.
gzip -9n -c "$ROOT/doc/virtiofsd.1" > "$D/share/man/man1/virtiofsd.1.gz"
chmod 0644 "$D/share/man/man1/virtiofsd.1.gz"
install -m 0644 "$ROOT/debian/copyright" "$ROOT/packaging/example.conf" "$ROOT/README.md" \
    "$ROOT"/doc/*.md "$D/$DOC/"

echo "installed virtiofsd under ${DESTDIR:-/} with prefix $PREFIX (compatibility link: $LINKS)"
if [ -z "$DESTDIR" ]; then
    echo "next: mkdir -p /etc/virtiofsd; cp $D/$DOC/example.conf /etc/virtiofsd/NAME.conf;"
    echo "      systemctl daemon-reload; systemctl enable --now virtiofsd@NAME.socket"
fi
