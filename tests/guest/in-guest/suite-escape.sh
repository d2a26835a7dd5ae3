# shellcheck shell=sh
# Escape suite: the guest (root) tries to reach the host outside the share. The host put a
# canary outside the share (on a strictatime tmpfs, so even a read shows) and, inside the share
# under escape/, symlinks pointing at it (absolute, relative, through /proc, to /). Every
# attempt's output is collected in /tmp/escape.out, which must never contain the canary's
# marker; the host checks afterwards that the canary was neither changed nor read
# (host_checks_escape in run.sh), and that the daemon never held a device node the guest made.
E=/mnt/escape
OUT=/tmp/escape.out
: > $OUT
# The share holds only the tail of the canary's content, so reading it proves nothing.
MARKER="HOST-CANARY-$(cat $E/canary-marker)"

# record CMD...: runs CMD, appends what it printed (both streams) to $OUT, never fails
record() { echo "== $*" >> $OUT; "$@" >> $OUT 2>&1 || true; }

t_dotdot() {
    eq "$(cd /mnt && cd .. && pwd)" / "cd .. from the mount root"
    eq "$(cd $E/../../../.. && pwd)" / "cd past the root"
    eq "$(stat -c %d:%i /mnt/..)" "$(stat -c %d:%i /)" "/mnt/.. is the guest's /"
    eq "$(escape dotdot $E 6)" "$(stat -c %d:%i /)" "openat(..) six times from escape/"
    [ ! -e /mnt/../canary ] || fail "/mnt/../canary exists"
    record ls -la /mnt/.. $E/../..
}
t escape-dotdot-past-the-root t_dotdot

# Host-made symlinks: the guest kernel resolves them in the guest's namespace; none may lead to
# the host's canary.
t_host_links() {
    for l in host-abs host-rel host-dir host-proc host-root; do
        [ -L $E/$l ] || fail "$l is not a symlink in the guest"
        record readlink $E/$l
        record cat $E/$l
        record ls $E/$l/
        record cat $E/$l/secret
    done
    eq "$(readlink $E/host-rel)" ../../canary/secret "relative link target"
    # Writing through them lands in the guest (or fails), never on the host.
    record sh -c "echo pwned > $E/host-rel"
    record sh -c "echo pwned >> $E/host-dir/secret"
    record truncate -s 0 $E/host-abs
}
t escape-host-made-symlinks t_host_links

t_guest_links() {
    ln -s / $E/g-root
    ln -s ../../.. $E/g-up
    ln -s ../../canary/secret $E/g-rel
    ln -s /proc/self/root/canary $E/g-proc
    ls $E/g-root/ | grep -qx init || fail "g-root does not show the guest's own /"
    for l in g-up g-rel g-proc; do
        record cat $E/$l
        record ls $E/$l/
        record cat $E/$l/secret
    done
    record sh -c "echo pwned > $E/g-rel"
    record chmod 777 $E/g-rel
}
t escape-guest-made-symlinks t_guest_links

# Hard links: to a symlink that points out (links the symlink itself), to the guest's own files
# (other filesystem), and linkat(AT_SYMLINK_FOLLOW) through a link.
t_hardlinks() {
    ln $E/host-abs $E/hl-abs
    eq "$(readlink $E/hl-abs)" "$(readlink $E/host-abs)" "hard link to a symlink is that symlink"
    eq "$(stat -c %h $E/host-abs)" 2 "link count of the linked symlink"
    must_fail_with "cross-device" ln /init $E/hl-init
    record ln -L $E/host-rel $E/hl-follow
    record cat $E/hl-abs
}
t escape-hard-links t_hardlinks

# Device nodes and a FIFO: the guest kernel serves them itself; the daemon never opens them on
# the host (the host lists the daemon's descriptors at the mark, while they are open here).
t_devices() {
    mknod $E/mem c 1 1
    mknod $E/null c 1 3
    mknod $E/sda b 8 0
    mkfifo $E/fifo
    exec 5<$E/null 6<>$E/fifo
    eq "$(head -c 4 <&5 | wc -c)" 0 "read from the null node"
    echo through-fifo >&6
    read -r line <&6
    eq "$line" through-fifo "FIFO round trip in the guest"
    mark devices-open
    exec 5<&- 6>&-
    record head -c 16 $E/mem
    record head -c 16 $E/sda
}
t escape-device-nodes t_devices

t_rename() {
    mkdir -p $E/movable/sub
    echo inside > $E/movable/file
    eq "$(escape rename $E/movable /movable)" EXDEV "rename a directory out of the mount"
    echo guest > /tmp/guest-file
    eq "$(escape rename /tmp/guest-file $E/in)" EXDEV "rename a guest file in"
    eq "$(escape exchange $E/movable /tmp)" EXDEV "exchange with a guest directory"
    eq "$(escape rename $E/movable $E/movable/sub/x)" EINVAL "rename a directory into itself"
    eq "$(escape rename $E/movable /mnt/moved)" ok "rename within the share"
    eq "$(escape rename /mnt/moved $E/movable)" ok "and back"
    eq "$(cat $E/movable/file)" inside "content after the round trip"
}
t escape-rename-out-and-in t_rename

# O_PATH descriptors of the links, then openat below them and reopening through /proc.
t_opath() {
    for l in host-dir host-root host-abs g-up g-rel; do
        record escape opath $E $l secret
    done
    record escape opath $E host-dir ../canary/secret
    eq "$(escape opath $E host-dir secret | head -n 1 | cut -d';' -f1)" "opath: ok" "O_PATH of a symlink"
}
t escape-openat-o-path t_opath

# File handles with guessed node ids: whatever opens is inside the share.
t_handles() {
    escape handles $E/canary-marker 300 > /tmp/handles.out 2>&1
    cat /tmp/handles.out >> $OUT
    tail -n 1 /tmp/handles.out
    if grep '^opened' /tmp/handles.out | grep -v ' /mnt' | grep -q .; then
        fail "a handle opened something outside /mnt: $(grep '^opened' /tmp/handles.out | grep -v ' /mnt' | head -n 3)"
    fi
}
t escape-guessed-file-handles t_handles

# Extended attributes of every namespace on a share file and on the links: whatever the daemon
# allows lands on the share's own files.
t_xattrs() {
    echo x > $E/xa
    for n in trusted.evil security.evil user.evil system.posix_acl_access; do
        record xattr set $E/xa $n value
        record xattr lset $E/host-abs $n value
        record xattr set $E/host-rel $n value
        record xattr get $E/host-abs $n
    done
    record xattr lget $E/host-abs user.canary
    record xattr get $E/host-rel user.canary
}
t escape-xattr-namespaces t_xattrs

t_nothing_read() {
    [ -n "$MARKER" ] || fail "no canary marker"
    if grep -q "$MARKER" $OUT; then
        fail "the canary's content reached the guest: $(grep -B2 "$MARKER" $OUT | head -n 6)"
    fi
    data escape_out_lines "$(wc -l < $OUT)"
}
t escape-canary-never-read t_nothing_read
