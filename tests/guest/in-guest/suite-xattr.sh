# shellcheck shell=sh
# Extended attribute features suite: the daemon runs with --posix-acl --security-label=auto
# --killpriv-v2 --xattrmap "/ok/all/system.posix_acl_/system.posix_acl_/ /map/user./user.guest./"
# (ACL attributes pass unchanged, guest user.* is stored as user.guest.user.* on the host, and
# unprefixed host user.* attributes are hidden). The host checks the results afterwards
# (host_checks_xattr in run.sh).
F=/mnt/fixtures
W=/mnt/xw

# ACLs as the kernel stores them (system.posix_acl_*): version 2, then (tag, perm, id) entries,
# little endian. user:: rw, group:: rw, other:: r.
ACL_RW_RW_R="hex:0200000001000600ffffffff04000600ffffffff20000400ffffffff"
# user:: rw, user:1000 rw, group:: none, mask:: rw, other:: none.
ACL_USER_1000="hex:0200000001000600ffffffff02000600e803000004000000ffffffff10000600ffffffff20000000ffffffff"

t_setup() {
    mkdir -p $W
    chmod 755 $W
}
t xattr-setup t_setup

t_map_user() {
    echo data > $W/f
    xattr set $W/f user.color blue
    eq "$(xattr get $W/f user.color)" blue "getxattr through the map"
    eq "$(xattr list $W/f)" user.color "listxattr shows the guest name only"
    # A guest name that looks prefixed is prefixed once more: it cannot reach the host's
    # user.guest.user.sneaky (which would show as user.sneaky); the host checks where it went.
    xattr set $W/f user.guest.user.sneaky v
    rc=0; xattr get $W/f user.sneaky 2>/dev/null || rc=$?
    eq "$rc" 3 "getxattr of user.sneaky (3 = ENODATA)"
}
t xattrmap-user-prefixed t_map_user

t_map_hidden() {
    # The host set user.from-host without the prefix: hidden and unreadable (ENODATA: 3).
    rc=0; xattr get $F/hello.txt user.from-host 2>/dev/null || rc=$?
    eq "$rc" 3 "getxattr of an unprefixed host attribute"
    xattr list $F/hello.txt > /tmp/l
    [ ! -s /tmp/l ] || fail "listed: $(cat /tmp/l)"
}
t xattrmap-host-names-hidden t_map_hidden

t_acl_default() {
    mkdir $W/acl $W/plain
    xattr set $W/acl system.posix_acl_default "$ACL_RW_RW_R"
    xattr list $W/acl | grep -qx system.posix_acl_default || fail "default ACL not listed"
    (umask 022; touch $W/acl/f $W/plain/f; mkdir $W/acl/d $W/plain/d)
    eq "$(stat -c %a $W/acl/f)" 664 "file under a default ACL (umask ignored)"
    eq "$(stat -c %a $W/plain/f)" 644 "file without a default ACL (umask 022)"
    eq "$(stat -c %a $W/acl/d)" 664 "directory under a default ACL"
    eq "$(stat -c %a $W/plain/d)" 755 "directory without a default ACL"
    xattr list $W/acl/d | grep -qx system.posix_acl_default || fail "default ACL not inherited"
}
t posix-acl-default-acl-and-umask t_acl_default

t_acl_access() {
    echo secret > $W/acl-file
    chmod 600 $W/acl-file
    must_fail_with "Permission denied" runas 1000 1000 cat $W/acl-file
    xattr set $W/acl-file system.posix_acl_access "$ACL_USER_1000"
    # The guest enforces the ACL: user 1000 may read now, user 1001 still not.
    eq "$(runas 1000 1000 cat $W/acl-file)" secret "read as user 1000 through the ACL"
    must_fail_with "Permission denied" runas 1001 1001 cat $W/acl-file
}
t posix-acl-access-enforced t_acl_access

t_killpriv_write() {
    echo x > $W/suid
    chmod 4777 $W/suid
    eq "$(stat -c %a $W/suid)" 4777 "mode before"
    runas 1000 1000 sh -c "echo y >> $W/suid"
    eq "$(stat -c %a $W/suid)" 777 "set-user-id cleared by an unprivileged write"
}
t killpriv-v2-write-clears-suid t_killpriv_write

t_killpriv_truncate() {
    echo x > $W/sgid
    chmod 2777 $W/sgid
    runas 1000 1000 truncate -s 0 $W/sgid
    eq "$(stat -c %a $W/sgid)" 777 "set-group-id cleared by an unprivileged truncate"
}
t killpriv-v2-truncate-clears-sgid t_killpriv_truncate

t_labels() {
    # No LSM in this guest: the kernel sends an empty security context with every creation.
    mkdir $W/label
    touch $W/label/f
    mkdir $W/label/d
    mkfifo $W/label/p
    ln -s f $W/label/l
    eq "$(ls $W/label | tr '\n' ' ')" "d f l p " "created"
}
t security-label-creations-work t_labels
