# shellcheck shell=bash
# The scenarios of tests/guest/reliability.sh (sourced by it; uses its helpers). Each
# scenario_NAME boots one or more guests and reports its tests.

# --- load --------------------------------------------------------------------------------------
# fio's jobs, shared by the guest (which writes and verifies) and the host (which verifies the
# same files again with --verify_only): 2 random-write and 2 sequential-write jobs at once.
FIO_JOB='[global]
directory=${FIO_DIR}
size=${FIO_MB}M
ioengine=psync
verify=crc32c
verify_fatal=1
do_verify=1
fsync_on_close=1
numjobs=2
[rand]
rw=randwrite
bs=4k
[seq]
rw=write
bs=128k'

declare -A LOAD_FDS LOAD_RSS LOAD_ANON
load_mark() {
    local name
    for name in plain pool; do
        local p="${LOAD_PIDS[$name]}"
        LOAD_FDS[$name-$1]="$(nfds "$p")"
        LOAD_RSS[$name-$1]="$(rss_kib "$p")"
        LOAD_ANON[$name-$1]="$(anon_kib "$p")"
        echo "# mark $1: daemon $name (pid $p): ${LOAD_FDS[$name-$1]} descriptors, RssAnon ${LOAD_ANON[$name-$1]} KiB, VmRSS ${LOAD_RSS[$name-$1]} KiB"
    done
}

scenario_load() {
    scen_dir load
    local d="$WORK/load" l="$OUT/load" name
    mkdir -p "$d/plain" "$d/pool"
    printf '%s\n' "$FIO_JOB" > "$d/plain/load.fio"
    declare -gA LOAD_PIDS=()
    local -A dpid
    start_daemon "$d/plain.sock" "$d/plain" "$l/daemon-plain.log" --xattr --cache auto
    dpid[plain]=$DPID
    start_daemon "$d/pool.sock" "$d/pool" "$l/daemon-pool.log" --xattr --cache auto --thread-pool-size 4
    dpid[pool]=$DPID
    for name in plain pool; do
        if ! wait_socket "$d/$name.sock"; then
            result fail "load: daemon $name listens" "$(tail -n 5 "$l/daemon-$name.log")"
            return
        fi
        LOAD_PIDS[$name]="$(serving_pid "${dpid[$name]}")"
    done
    start_qemu "$l" load "rel_secs=$SECS rel_fio_mb=$FIO_MB" "$d/plain.sock=share" "$d/pool.sock=pool"
    run_guest "$l" load_mark
    guest_end "load: " "$l"
    for name in plain pool; do
        daemon_end "load: $name: " "${dpid[$name]}" "$l/daemon-$name.log"
    done
    for name in plain pool; do
        local p="load: $name: host: " s="$d/$name"
        local out
        if out="$(cd "$s/keep" 2>&1 && sha256sum -c SHA256SUMS 2>&1)" && [ "$(grep -c ': OK$' <<<"$out")" = 8 ]; then
            result ok "${p}8 fsync'ed files read back with the guest's sha256" "$out"
        else
            result fail "${p}8 fsync'ed files read back with the guest's sha256" "$out"
        fi
        if out="$(cd "$s" && FIO_DIR="$s/fio" FIO_MB="$FIO_MB" fio --verify_only --output="$l/fio-verify-$name.txt" "$d/plain/load.fio" 2>&1)" \
           && ! grep -qE 'err= *[1-9]' "$l/fio-verify-$name.txt" && [ "$(ls "$s/fio" | wc -l)" = 4 ]; then
            result ok "${p}fio's 4 files verify (crc32c) on the host" "$(ls -l "$s/fio")"
        else
            result fail "${p}fio's 4 files verify (crc32c) on the host" "$out
$(grep -E 'err=|verify' "$l/fio-verify-$name.txt" | head)
$(ls -l "$s/fio" 2>&1)"
        fi
        local fdi fl fa ri rl ra
        fdi="${LOAD_FDS[$name-idle]:-}"; fl="${LOAD_FDS[$name-loaded]:-}"; fa="${LOAD_FDS[$name-after]:-}"
        ri="${LOAD_ANON[$name-idle]:-}"; rl="${LOAD_ANON[$name-loaded]:-}"; ra="${LOAD_ANON[$name-after]:-}"
        echo "# $name: descriptors idle/loaded/after: $fdi/$fl/$fa; RssAnon KiB idle/loaded/after: $ri/$rl/$ra; VmRSS (with guest pages) KiB: ${LOAD_RSS[$name-idle]:-}/${LOAD_RSS[$name-loaded]:-}/${LOAD_RSS[$name-after]:-}"
        if [ -n "$fdi" ] && [ -n "$fa" ]; then
            # after: the guest still knows the share root and the files it keeps open: none
            check_le "${p}descriptors back near idle after the load (idle $fdi + 8)" "$fa" $((fdi + 8)) descriptors
            # the daemon's own memory (not the guest pages it touched): the allocator may keep
            # some of what the load used; 16 MiB over idle is the limit (doc/reliability.md)
            check_le "${p}own memory (RssAnon) back near idle after the load (idle $ri KiB + 16 MiB)" "$ra" $((ri + 16384)) "RssAnon KiB"
        else
            result fail "${p}descriptors and RSS measured at the marks" "idle '$fdi' after '$fa'"
        fi
    done
}

# --- full --------------------------------------------------------------------------------------
# loop_ext4 DIR SIZE MKFS_ARGS...: DIR becomes a mounted ext4 of SIZE (no reserved blocks, no
# lazy initialisation, so nothing changes it in the background)
loop_ext4() {
    local dir="$1" size="$2"; shift 2
    mkdir -p "$dir"
    truncate -s "$size" "$dir.img" &&
        mkfs.ext4 -q -F -b 4096 -m 0 -E lazy_itable_init=0,lazy_journal_init=0 "$@" "$dir.img" &&
        mount -o loop,noatime "$dir.img" "$dir" && echo "$dir" >> "$WORK/mounts"
}

scenario_full() {
    scen_dir full
    local d="$WORK/full" l="$OUT/full" name
    if ! loop_ext4 "$d/blocks" 16M || ! loop_ext4 "$d/inodes" 16M -N 64; then
        result fail "full: loop-mounted ext4 file systems" "mkfs or mount failed"
        return
    fi
    echo "# blocks: $(df -B4k --output=size,avail "$d/blocks" | tail -1); inodes: $(df -i "$d/inodes" | tail -1)"
    local -A dpid
    for name in blocks inodes; do
        start_daemon "$d/$name.sock" "$d/$name" "$l/daemon-$name.log" --xattr --cache auto
        dpid[$name]=$DPID
        wait_socket "$d/$name.sock" || { result fail "full: daemon $name listens" "$(tail -n 5 "$l/daemon-$name.log")"; return; }
    done
    start_qemu "$l" full "" "$d/blocks.sock=share" "$d/inodes.sock=inodes"
    run_guest "$l" no_handler
    guest_end "full: " "$l"
    for name in blocks inodes; do
        daemon_end "full: $name: " "${dpid[$name]}" "$l/daemon-$name.log"
        local out
        if out="$(cd "$d/$name/seed" 2>&1 && sha256sum -c SHA256SUMS 2>&1)" && [ "$(grep -c ': OK$' <<<"$out")" = 3 ]; then
            result ok "full: $name: host: files written before the fs filled are intact" "$out"
        else
            result fail "full: $name: host: files written before the fs filled are intact" "$out"
        fi
    done
    check "full: blocks: host: the file written after freeing space" \
        "$(sha256sum "$d/blocks/after" 2>&1 | cut -d' ' -f1)" "$(data_of "$l/console.log" after_sha256)" sha256
    echo "# inode share: the guest made $(data_of "$l/console.log" inodes_created) files before ENOSPC"
    local errs
    errs="$(cat "$l"/daemon-*.log | grep -cE '\b(ERROR|panic)' || true)"
    check "full: host: no ERROR or panic in the daemons' logs" "$errs" 0 "lines"
}

# --- kill-qemu ---------------------------------------------------------------------------------
killq_mark() {
    [ "$1" = holding ] || return
    KQ_FDS="$(nfds "$KQ_SERVING")"
    fds_of "$KQ_SERVING" > "$OUT/kill-qemu/fds-holding.txt"
    kill -KILL "$QPID"
    KQ_KILLED=$SECONDS
}
fds_of() { local f; for f in /proc/"$1"/fd/*; do echo "${f##*/} $(readlink "$f")"; done; }

scenario_kill_qemu() {
    scen_dir kill-qemu
    local d="$WORK/kill-qemu" l="$OUT/kill-qemu"
    mkdir -p "$d/share"
    KQ_FDS=""; KQ_KILLED=""
    start_daemon "$d/vfs.sock" "$d/share" "$l/daemon.log" --xattr --cache auto
    local dp=$DPID
    wait_socket "$d/vfs.sock" || { result fail "kill-qemu: daemon listens" "$(tail -n 5 "$l/daemon.log")"; return; }
    KQ_SERVING="$(serving_pid "$dp")"
    start_qemu "$l" killq "" "$d/vfs.sock=share"
    run_guest "$l" killq_mark
    report_tap "$l/console.log" "kill-qemu: "
    if [ -z "$KQ_KILLED" ]; then
        result fail "kill-qemu: QEMU killed while the guest held files open" "QEMU: $QRC; no holding mark"
        return
    fi
    local held
    held="$(grep -c '/held/f' "$l/fds-holding.txt")"
    echo "# at the kill the daemon had $KQ_FDS descriptors, $held of them on the guest's open files"
    check_le "kill-qemu: the daemon had the guest's open files open (at least 4)" "$((4 - held))" 0 "4 - held"
    local t0=$SECONDS
    daemon_end "kill-qemu: " "$dp" "$l/daemon.log"
    echo "# the daemon exited $((SECONDS - t0))s after the kill was reaped"
    check "kill-qemu: host: socket removed" "$([ -e "$d/vfs.sock" ] && echo left)" "" "socket"
    check "kill-qemu: host: lock file removed" "$([ -e "$d/vfs.sock.pid" ] && echo left)" "" "vfs.sock.pid"
    check "kill-qemu: host: the guest's fsync'ed file is intact" \
        "$(sha256sum "$d/share/synced" 2>&1 | cut -d' ' -f1)" "$(data_of "$l/console.log" synced_sha256)" sha256
    check "kill-qemu: host: daemon logged the disconnect without an error" \
        "$(grep -cE '\b(ERROR|panic)' "$l/daemon.log")" 0 "ERROR lines"
}

# --- kill-daemon -------------------------------------------------------------------------------
fsynced_count() { tr -d '\r' < "$1" | grep -c '^#FSYNCED '; }

# kill_daemon_run NAME: boot 1 writes, the daemon (supervisor and serving child) is killed with
# SIGKILL after 5 fsync'ed files; the guest's progress is watched; a new daemon is started on
# the same socket path. Sets KD_* for the caller.
kill_daemon_run() {
    local name="$1" d="$WORK/$1" l="$OUT/$1"
    mkdir -p "$d/share"
    start_daemon "$d/vfs.sock" "$d/share" "$l/daemon-1.log" --xattr --cache auto
    KD_D1=$DPID
    wait_socket "$d/vfs.sock" || { result fail "$name: daemon listens" "$(tail -n 5 "$l/daemon-1.log")"; return 1; }
    local serving
    serving="$(serving_pid "$KD_D1")"
    start_qemu "$l" killd "" "$d/vfs.sock=share"
    local t0=$SECONDS
    while [ "$(fsynced_count "$l/console.log")" -lt 5 ]; do
        if [ $((SECONDS - t0)) -gt "$TIMEOUT" ] || ! kill -0 "$QPID" 2>/dev/null; then
            [ "${KD_QUIET:-0}" = 1 ] || result fail "$name: the guest fsync'ed 5 files" "$(tr -d '\r' < "$l/console.log" | tail -n 20)"
            reap "$QPID" 0; QRC="$REAPED"
            qemu_aborted "$l"
            return 1
        fi
        sleep 0.1
    done
    kill -KILL "$KD_D1" "$serving"
    wait "$KD_D1" 2>/dev/null; KD_RC1=$?
    forget_pid "$KD_D1"
    KD_AT_KILL="$(fsynced_count "$l/console.log")"
    KD_LEFT=""
    local e
    for e in vfs.sock vfs.sock.pid; do [ -e "$d/$e" ] && KD_LEFT+="$e "; done
    sleep 1
    KD_AFTER1="$(fsynced_count "$l/console.log")"
    # a new daemon on the same path, at once
    local t1
    t1=$(date +%s%N)
    start_daemon "$d/vfs.sock" "$d/share" "$l/daemon-2.log" --xattr --cache auto
    KD_D2=$DPID
    if wait_socket "$d/vfs.sock" && kill -0 "$KD_D2" 2>/dev/null; then
        KD_START_MS=$(( ($(date +%s%N) - t1) / 1000000 ))
    else
        KD_START_MS=""
    fi
    # watch the old guest for a while: does it make progress (reconnect) or hang?
    sleep "${KD_WATCH:-5}"
    KD_AFTER2="$(fsynced_count "$l/console.log")"
    KD_QEMU_ALIVE=no
    kill -0 "$QPID" 2>/dev/null && KD_QEMU_ALIVE=yes
    reap "$QPID" 0
    # what the guest saw as durable must be on the host
    local f sha bad=0 n=0
    : > "$d/share/VERIFY.sha256"
    while read -r f sha; do
        n=$((n + 1))
        printf '%s  %s\n' "$sha" "$f" >> "$d/share/VERIFY.sha256"
        [ "$(sha256sum "$d/share/$f" 2>/dev/null | cut -d' ' -f1)" = "$sha" ] || { bad=$((bad + 1)); echo "# $f differs" >&2; }
    done < <(tr -d '\r' < "$l/console.log" | sed -n 's/^#FSYNCED //p')
    KD_N=$n; KD_BAD=$bad
    return 0
}

scenario_kill_daemon() {
    scen_dir kill-daemon
    local d="$WORK/kill-daemon" l="$OUT/kill-daemon"
    kill_daemon_run kill-daemon || return
    echo "# new daemon listening ${KD_START_MS:-?} ms after it was started; killed after $KD_AT_KILL fsync'ed files (daemon exit $KD_RC1); left behind: $KD_LEFT; fsync'ed files 1 s / 6 s later: $KD_AFTER1 / $KD_AFTER2; QEMU alive 6 s after the kill: $KD_QEMU_ALIVE"
    check "kill-daemon: host: every file the guest fsync'ed is intact ($KD_N files)" "$KD_BAD" 0 "files differing"
    check "kill-daemon: the socket and its lock were left behind by the killed daemon" "$KD_LEFT" "vfs.sock vfs.sock.pid " "entries"
    if [ -n "$KD_START_MS" ]; then
        check_le "kill-daemon: a new daemon listens on the same socket path at once (ms)" "$KD_START_MS" 2000 ms
    else
        result fail "kill-daemon: a new daemon listens on the same socket path at once" "$(tail -n 5 "$l/daemon-2.log")"
        return
    fi
    # Today's behaviour, recorded (doc/reliability.md): the old guest hangs, QEMU keeps running.
    check "kill-daemon: the old guest makes no progress after the kill (QEMU keeps running)" \
        "$((KD_AFTER2 - KD_AFTER1)) $KD_QEMU_ALIVE" "0 yes" "new fsync'ed files, QEMU alive"
    start_qemu "$l" verify "" "$d/vfs.sock=share"
    run_guest "$l" no_handler
    guest_end "kill-daemon: new VM: " "$l"
    daemon_end "kill-daemon: new daemon: " "$KD_D2" "$l/daemon-2.log"
}

# shellcheck disable=SC2034  # CHARDEV_OPTS is read by start_qemu in reliability.sh
# --- reconnect (a measurement) -----------------------------------------------------------------
scenario_reconnect() {
    scen_dir reconnect
    local l="$OUT/reconnect"
    CHARDEV_OPTS=",${RECONNECT_OPT:-reconnect-ms=500}"
    KD_WATCH=20
    KD_QUIET=1
    if ! kill_daemon_run reconnect; then
        CHARDEV_OPTS=""; KD_WATCH=5; KD_QUIET=0
        # QEMU 10: the chardev connects asynchronously with reconnect-ms and vhost-user-fs does
        # not wait for it, so the device fails to realize (recorded in doc/reliability.md)
        sed 's/^/# qemu: /' "$l/qemu.log"
        if grep -q 'vhost_backend_init failed' "$l/qemu.log"; then
            result ok "reconnect: QEMU refuses vhost-user-fs on a chardev with reconnect-ms (as documented)"
        else
            result fail "reconnect: the guest fsync'ed 5 files" "$(tr -d '\r' < "$l/console.log" | tail -n 20)"
        fi
        kill -TERM "$KD_D1" 2>/dev/null; wait "$KD_D1" 2>/dev/null; forget_pid "$KD_D1"
        return
    fi
    CHARDEV_OPTS=""; KD_WATCH=5; KD_QUIET=0
    echo "# reconnect-ms=500: fsync'ed files at the kill $KD_AT_KILL, 1 s later $KD_AFTER1, 21 s later (new daemon listening after ${KD_START_MS:-?} ms) $KD_AFTER2; QEMU alive: $KD_QEMU_ALIVE"
    echo "# new daemon's log after the kill: $(grep -cE 'request' "$l/daemon-2.log") request lines; first lines:"
    head -n 5 "$l/daemon-2.log" | sed 's/^/#   /'
    tail -n 5 "$l/qemu.log" | sed 's/^/# qemu: /'
    check "reconnect: host: every file the guest fsync'ed is intact ($KD_N files)" "$KD_BAD" 0 "files differing"
    kill -TERM "$KD_D2" 2>/dev/null; wait "$KD_D2" 2>/dev/null; forget_pid "$KD_D2"
}

# --- host-change -------------------------------------------------------------------------------
# hc_change SHARE N: round N's changes (see in-guest/suite-hostchange.sh); N=0 makes the files
hc_change() {
    python3 - "$1" "$2" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
def body(name, gen):
    return (b"%-5s g%08d\n" % (name.encode(), gen)) * 4096
def whole(path, data):
    with open(path, "wb") as f:
        f.write(data)
if n == 0:
    whole(os.path.join(d, "rn"), body("rn", 0))
    whole(os.path.join(d, "ip"), body("ip", 0))
    whole(os.path.join(d, "c-0"), body("c", 0))
    whole(os.path.join(d, "m-0"), body("m", 0))
    sys.exit(0)
# a complete new file renamed over the old one
whole(os.path.join(d, ".rn.tmp"), body("rn", n))
os.rename(os.path.join(d, ".rn.tmp"), os.path.join(d, "rn"))
# the same file rewritten in place with one write (no truncation)
fd = os.open(os.path.join(d, "ip"), os.O_WRONLY)
assert os.pwrite(fd, body("ip", n), 0) == 65536
os.close(fd)
whole(os.path.join(d, "c-%d" % n), body("c", n))
os.unlink(os.path.join(d, "c-%d" % (n - 1)))
os.rename(os.path.join(d, "m-%d" % (n - 1)), os.path.join(d, "m-%d" % n))
PY
}
hc_mark() {
    case "$1" in change-*) ;; *) return ;; esac
    local n="${1#change-}" m
    for m in auto metadata never always; do hc_change "$WORK/host-change/$m" "$n"; done
    printf '%s\n' "$n" > "$WORK/host-change/never/.ack"
    mv "$WORK/host-change/never/.ack" "$WORK/host-change/never/ack"
}

scenario_host_change() {
    scen_dir host-change
    local d="$WORK/host-change" l="$OUT/host-change" m
    local -A dpid
    for m in auto metadata never always; do
        mkdir -p "$d/$m"
        hc_change "$d/$m" 0
        start_daemon "$d/$m.sock" "$d/$m" "$l/daemon-$m.log" --cache "$m"
        dpid[$m]=$DPID
    done
    for m in auto metadata never always; do
        wait_socket "$d/$m.sock" || { result fail "host-change: daemon $m listens" "$(tail -n 5 "$l/daemon-$m.log")"; return; }
    done
    start_qemu "$l" hostchange "rel_rounds=$ROUNDS" "$d/auto.sock=share" "$d/metadata.sock=metadata" \
        "$d/never.sock=never" "$d/always.sock=always"
    run_guest "$l" hc_mark
    guest_end "host-change: " "$l"
    for m in auto metadata never always; do
        daemon_end "host-change: $m: " "${dpid[$m]}" "$l/daemon-$m.log"
    done
    echo "# auto: latencies (ms) of the rounds: $(tr -d '\r' < "$l/console.log" | sed -n 's/^#DATA auto_latency_ms_[0-9]* //p' | tr '\n' ' ')"
    tr -d '\r' < "$l/console.log" | grep -E '^#DATA (metadata_state|always_errors)' | sed 's/^#DATA /# /' | head -n 12
}

# --- fsync -------------------------------------------------------------------------------------
FS_MODES="mnt always wb"
fs_mark() {
    local m f
    case "$1" in fsynced|synced) ;; *) return ;; esac
    for m in $FS_MODES; do
        cp "$WORK/fsync/$m.strace" "$OUT/fsync/$m-at-$1.strace" 2>/dev/null
        for f in fsync fdatasync syncfs none; do
            FS_SHA[$1-$m-$f]="$(sha256sum "$WORK/fsync/$m/f-$f" 2>/dev/null | cut -d' ' -f1)"
        done
    done
}

scenario_fsync() {
    scen_dir fsync
    local d="$WORK/fsync" l="$OUT/fsync" m f
    declare -gA FS_SHA=()
    local -A dpid flags=([mnt]="--cache auto" [always]="--cache always" [wb]="--cache always --writeback")
    local -a DAEMON_PREFIX   # each daemon runs under strace (start_daemon reads it)
    for m in $FS_MODES; do
        mkdir -p "$d/$m"
        # shellcheck disable=SC2054,SC2034  # the commas belong to strace's -e
        DAEMON_PREFIX=(strace -f -qq -y -e trace=fsync,fdatasync,syncfs -o "$d/$m.strace")
        # shellcheck disable=SC2086
        start_daemon "$d/$m.sock" "$d/$m" "$l/daemon-$m.log" ${flags[$m]}
        dpid[$m]=$DPID
    done
    for m in $FS_MODES; do
        wait_socket "$d/$m.sock" || { result fail "fsync: daemon $m listens" "$(tail -n 5 "$l/daemon-$m.log")"; return; }
    done
    start_qemu "$l" fsync "" "$d/mnt.sock=share" "$d/always.sock=always" "$d/wb.sock=wb"
    run_guest "$l" fs_mark
    guest_end "fsync: " "$l"
    for m in $FS_MODES; do
        daemon_end "fsync: $m: " "${dpid[$m]}" "$l/daemon-$m.log"
        local s="$l/$m-at-synced.strace" p="fsync: ${flags[$m]}: host: "
        if [ ! -s "$s" ]; then
            result fail "${p}strace of the daemon at the synced mark" "no strace output"
            continue
        fi
        # strace -y names each descriptor's file: "fsync(12</f-fsync>) = 0"
        check "${p}guest fsync became an fsync(2) of the file" \
            "$(grep -cE '^[0-9]+ +fsync\([0-9]+<[^>]*/f-fsync>\) += 0' "$s")" 1 "calls"
        check "${p}guest fdatasync became an fdatasync(2) of the file" \
            "$(grep -cE '^[0-9]+ +fdatasync\([0-9]+<[^>]*/f-fdatasync>\) += 0' "$s")" 1 "calls"
        local nsyncfs
        nsyncfs="$(grep -cE '^[0-9]+ +syncfs\([0-9]+<[^>]*>\) += 0' "$s")"
        check_le "${p}guest syncfs became a syncfs(2) on the share" "$((1 - nsyncfs))" 0 "1 - syncfs calls ($nsyncfs)"
        check "${p}no sync call for the file the guest never synced" \
            "$(grep -cE 'f-none>' "$s")" 0 "calls naming f-none"
        for f in fsync fdatasync; do
            check "${p}f-$f on the host holds what the guest wrote, once the call returned" \
                "${FS_SHA[fsynced-$m-$f]:-missing}" "$(data_of "$l/console.log" "sha_${m}_$f")" sha256
        done
        check "${p}f-syncfs on the host holds what the guest wrote, once syncfs returned" \
            "${FS_SHA[synced-$m-syncfs]:-missing}" "$(data_of "$l/console.log" "sha_${m}_syncfs")" sha256
        local w
        w="$(data_of "$l/console.log" "sha_${m}_none")"
        echo "# ${flags[$m]}: sync calls: $(grep -c 'sync' "$s"); the never-synced f-none on the host before syncfs: $([ "${FS_SHA[fsynced-$m-none]:-}" = "$w" ] && echo complete || echo incomplete), after: $([ "${FS_SHA[synced-$m-none]:-}" = "$w" ] && echo complete || echo incomplete)"
    done
}

# --- kill-qemu under socket activation -----------------------------------------------------------
# A stand-in for systemd with a virtiofsd@.socket unit (Accept=no): it holds the listening socket,
# starts the daemon with it as descriptor 3 (LISTEN_FDS=1, LISTEN_PID) when a client connects,
# and after the daemon exits waits for the next client; RUNS daemons in all.
ACTIVATOR='
import os, select, socket, subprocess, sys
path, runs, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cmd = sys.argv[4:]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(8)
os.set_inheritable(s.fileno(), True)
out = open(log, "a", buffering=1)
for n in range(1, runs + 1):
    select.select([s], [], [])
    def fd3():
        os.dup2(s.fileno(), 3)
    p = subprocess.Popen(["sh", "-c", "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\""] + cmd,
                         preexec_fn=fd3, close_fds=False)
    out.write("started %d pid %d\n" % (n, p.pid))
    rc = p.wait()
    out.write("exited %d status %d socket %s\n" % (n, rc, "present" if os.path.exists(path) else "gone"))
'

scenario_kill_qemu_activated() {
    scen_dir kill-qemu-activated
    local d="$WORK/kill-qemu-activated" l="$OUT/kill-qemu-activated"
    mkdir -p "$d/share"
    : > "$l/activator.log"
    python3 -c "$ACTIVATOR" "$d/vfs.sock" 2 "$l/activator.log" "$DAEMON" --shared-dir "$d/share" \
        --xattr --log-level debug >"$l/daemon.log" 2>&1 &
    local ap=$!
    track "$ap"
    wait_socket "$d/vfs.sock" || { result fail "kill-qemu-activated: the activator listens" "$(cat "$l/daemon.log")"; return; }
    KQ_FDS=""; KQ_KILLED=""
    # the serving process is found once a daemon runs
    start_qemu "$l" killq "" "$d/vfs.sock=share"
    local _
    for _ in $(seq 1 100); do grep -q '^started 1' "$l/activator.log" && break; sleep 0.1; done
    KQ_SERVING="$(serving_pid "$(awk '/^started 1/ { print $4 }' "$l/activator.log")")"
    run_guest "$l" killq_mark_activated
    report_tap "$l/console.log" "kill-qemu-activated: first VM: "
    for _ in $(seq 1 100); do grep -q '^exited 1' "$l/activator.log" && break; sleep 0.1; done
    check "kill-qemu-activated: the daemon exits 0 after QEMU is killed and leaves the activated socket" \
        "$(sed -n 's/^exited 1 //p' "$l/activator.log")" "status 0 socket present" "activator"
    printf '%s  synced\n' "$(data_of "$l/console.log" synced_sha256)" > "$d/share/VERIFY.sha256"
    mv "$l/console.log" "$l/console-1.log"
    start_qemu "$l" verify "" "$d/vfs.sock=share"
    run_guest "$l" no_handler
    guest_end "kill-qemu-activated: next VM: " "$l"
    reap "$ap" 10
    check "kill-qemu-activated: the next VM was served by a second daemon, which exits 0" \
        "$(sed -n 's/^exited 2 //p' "$l/activator.log")" "status 0 socket present" "activator"
}
killq_mark_activated() {
    [ "$1" = holding ] || return
    kill -KILL "$QPID"
    KQ_KILLED=$SECONDS
}
