# shellcheck shell=sh
# Host-change suite (tests/guest/reliability.sh): four shares of the same layout, served with
# --cache auto (/mnt), metadata (/m/metadata), never (/m/never) and always (/m/always). In each
# round the guest reads everything (so that it is cached), prints "#MARK change-N" and waits
# until the host has made round N's changes in every share (the host then writes N to
# /m/never/ack): rn replaced by rename of a complete new file, ip rewritten in place, c-N
# created and c-(N-1) deleted, m-(N-1) renamed to m-N. Every file is 4096 lines of
# "NAME  gGENERATION" (16 bytes each), so a mix of two generations or of two files shows.
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p"; }
ROUNDS="$(arg rel_rounds)"
LIMIT_CS=300    # auto promises 1 s; under TCG 3 s is the limit

now_cs() { read -r up _ < /proc/uptime; echo "${up%.*}${up#*.}"; }
line() { printf '%-5s g%08d' "$1" "$2"; }

# content FILE: the one distinct line of FILE, or "MIXED:..." / "SIZE:..." / "ERROR"
content() {
    _c="$(sort -u "$1" 2>/dev/null)" || { echo ERROR; return; }
    _s="$(stat -c %s "$1" 2>/dev/null)"
    case "$_c" in
        *"
"*) echo "MIXED:$(echo "$_c" | tr '\n' '|')" ;;
        *) if [ "$_s" = 65536 ]; then echo "$_c"; else echo "SIZE:$_s:$_c"; fi ;;
    esac
}

# state DIR N: "new" when every change of round N is visible in DIR, "old" when none is, or a
# list of what is visible; exits the test on a mix within one file or another file's data
state() {
    _d="$1"; _n="$2"; _p=$((_n - 1)); _v=""
    for f in rn ip; do
        _x="$(content "$_d/$f")"
        case "$_x" in
            "$(line "$f" "$_n")") _v="$_v $f:new" ;;
            "$(line "$f" "$_p")") _v="$_v $f:old" ;;
            *) fail "$_d/$f in round $_n: $_x" ;;
        esac
    done
    [ -e "$_d/c-$_n" ] && _v="$_v c-new:yes" || _v="$_v c-new:no"
    [ -e "$_d/c-$_p" ] && _v="$_v c-old:yes" || _v="$_v c-old:no"
    [ -e "$_d/m-$_n" ] && _v="$_v m-new:yes" || _v="$_v m-new:no"
    [ -e "$_d/m-$_p" ] && _v="$_v m-old:yes" || _v="$_v m-old:no"
    case "$_v" in
        " rn:new ip:new c-new:yes c-old:no m-new:yes m-old:no") echo new ;;
        *) echo "$_v" ;;
    esac
}

warm() {
    for d in /mnt /m/metadata /m/never /m/always; do
        cat "$d/rn" "$d/ip" > /dev/null 2>&1 || [ "$d" = /m/always ]
        ls "$d" > /dev/null
        stat "$d/c-$(($1 - 1))" "$d/m-$(($1 - 1))" > /dev/null
        stat "$d/c-$1" > /dev/null 2>&1 || true     # a negative entry for the name to come
    done
}

t_mounts() {
    for m in metadata never always; do
        mkdir -p "/m/$m"
        mount -t virtiofs "$m" "/m/$m"
    done
}
t mount-metadata-never-always t_mounts

# always: whatever the guest reads of a file is that file's own (any generation), or an error
# (a file replaced or deleted on the host may read as ESTALE while the guest keeps its old
# entry: doc/caching.md); never another file's data
always_check() {
    _n="$1"
    for f in rn ip "c-$((_n - 1))"; do
        if cat "/m/always/$f" > /tmp/always.out 2>/tmp/always.err; then
            _names="$(sed 's/ *g[0-9]*$//' /tmp/always.out | sort -u | tr '\n' ' ')"
            case "$f" in c-*) _want="c " ;; *) _want="$f " ;; esac
            [ ! -s /tmp/always.out ] || eq "$_names" "$_want" "names in the lines of always/$f"
        else
            echo "always/$f in round $_n: $(cat /tmp/always.err)" >> /tmp/always.errors
        fi
    done
}

t_round() {
    i="$1"
    warm "$i"
    echo "#MARK change-$i" >&3
    n=0
    while [ "$(cat /m/never/ack 2>/dev/null)" != "$i" ]; do
        n=$((n + 1)); [ $n -gt 600 ] && fail "the host did not make round $i's changes"; sleep 0.05
    done
    t0="$(now_cs)"
    eq "$(state /m/never "$i")" new "never: state right after the change"
    eq "$(content /m/metadata/ip)" "$(line ip "$i")" "metadata: in-place rewrite (direct I/O) at once"
    state /m/metadata "$i" > /tmp/meta.state
    data "metadata_state_$i" "$(cat /tmp/meta.state)"
    always_check "$i"
    while :; do
        s="$(state /mnt "$i")"
        [ "$s" = new ] && break
        [ $(($(now_cs) - t0)) -gt $LIMIT_CS ] && fail "auto: after ${LIMIT_CS}0 ms still:$s"
        always_check "$i"
        state /m/metadata "$i" > /dev/null
    done
    lat=$(($(now_cs) - t0))
    echo "auto: all changes seen after ${lat}0 ms"
    [ ! -s /tmp/always.errors ] || data "always_errors_$i" "$(sort -u /tmp/always.errors | tr '\n' ';')"
    rm -f /tmp/always.errors
    data "auto_latency_ms_$i" "${lat}0"
}
r=1
while [ "$r" -le "$ROUNDS" ]; do
    t "round $r: never at once, auto within 3 s, metadata data at once, no mixed or foreign contents" t_round "$r"
    r=$((r + 1))
done
cd /
for m in metadata never always; do umount "/m/$m"; done
