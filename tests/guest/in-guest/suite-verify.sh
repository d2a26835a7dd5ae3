# shellcheck shell=sh
# Verify suite (tests/guest/reliability.sh): checks the files listed in /mnt/VERIFY.sha256
# that the host wrote after an earlier guest's run.
t_verify() {
    cd /mnt || fail "no /mnt"
    [ -s VERIFY.sha256 ] || fail "no VERIFY.sha256 in the share"
    sha256sum -c VERIFY.sha256
}
t files-read-back-through-the-new-daemon t_verify
