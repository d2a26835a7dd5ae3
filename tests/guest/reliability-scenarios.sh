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
        local fi fl fa ri rl ra
        fi="${LOAD_FDS[$name-idle]:-}"; fl="${LOAD_FDS[$name-loaded]:-}"; fa="${LOAD_FDS[$name-after]:-}"
        ri="${LOAD_ANON[$name-idle]:-}"; rl="${LOAD_ANON[$name-loaded]:-}"; ra="${LOAD_ANON[$name-after]:-}"
        echo "# $name: descriptors idle/loaded/after: $fi/$fl/$fa; RssAnon KiB idle/loaded/after: $ri/$rl/$ra; VmRSS (with guest pages) KiB: ${LOAD_RSS[$name-idle]:-}/${LOAD_RSS[$name-loaded]:-}/${LOAD_RSS[$name-after]:-}"
        if [ -n "$fi" ] && [ -n "$fa" ]; then
            # after: the guest still knows the share root and the files it keeps open: none
            check_le "${p}descriptors back near idle after the load (idle $fi + 8)" "$fa" $((fi + 8)) descriptors
            # the daemon's own memory (not the guest pages it touched): the allocator may keep
            # some of what the load used; 16 MiB over idle is the limit (doc/reliability.md)
            check_le "${p}own memory (RssAnon) back near idle after the load (idle $ri KiB + 16 MiB)" "$ra" $((ri + 16384)) "RssAnon KiB"
        else
            result fail "${p}descriptors and RSS measured at the marks" "idle '$fi' after '$fa'"
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
        mount -o loop,noatime "$dir.img" "$dir" && MOUNTS+=("$dir")
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
