# shellcheck shell=sh
# Killed-QEMU suite (tests/guest/reliability.sh): the guest writes and fsyncs a file, keeps
# files and a directory open in background processes, says "#MARK holding" and waits; the host
# then kills QEMU with SIGKILL and checks that the daemon exits 0 and removes its socket.
t_hold() {
    mkdir -p /mnt/held
    for i in 1 2 3 4; do echo "held $i" > "/mnt/held/f$i"; done
    dd if=/dev/urandom of=/mnt/synced bs=64k count=4 2>/dev/null
    sync /mnt/synced
    data synced_sha256 "$(sha256sum /mnt/synced | cut -d' ' -f1)"
    for i in 1 2 3 4; do
        sh -c "exec 5</mnt/held/f$i 6>>/mnt/held/f$i; cd /mnt/held; sleep 600" &
    done
    sleep 1
}
t files-written-and-held-open t_hold
mark holding
sleep 600
echo "# QEMU was not killed"
