# shellcheck shell=sh
# Killed-daemon suite (tests/guest/reliability.sh): the guest writes files one after another;
# after each fsync succeeds it prints "#FSYNCED NAME SHA256" (the host kills the daemon after a
# few of them). Between two synced files it writes one it never syncs. When the daemon is gone
# the guest's next request never returns: the loop stops where it is, and the host measures
# that (or, with chardev reconnect, whether it resumes).
i=1
while [ $i -le 400 ]; do
    dd if=/dev/urandom of=/mnt/w$i bs=16k count=$((i % 7 + 1)) 2>/dev/null || { echo "# write w$i failed"; break; }
    sync /mnt/w$i || { echo "# fsync w$i failed"; break; }
    echo "#FSYNCED w$i $(sha256sum /mnt/w$i | cut -d' ' -f1)"
    dd if=/dev/urandom of=/mnt/u$i bs=16k count=2 2>/dev/null
    i=$((i + 1))
done
echo "# writer loop ended at $i"
