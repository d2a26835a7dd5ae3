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
