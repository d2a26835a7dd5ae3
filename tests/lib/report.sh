# shellcheck shell=bash
# Results of the QEMU-level tests (sourced, not run). One line per test, "ok N NAME" or
# "not ok N NAME", its diagnostic under it as "# " lines, and a last line "P passed, F failed"
# (", S skipped" when a test was skipped), which tests/run.sh and CI read.
#
#   result ok|fail|skip NAME [DIAG]  one test. DIAG is shown under a failure, under a pass only
#                                    with VERBOSE=1; a skip is "ok N NAME # SKIP DIAG"
#   check NAME GOT WANT [WHAT]       passes when GOT = WANT; WHAT names the value (default "value")
#   check_le NAME GOT LIMIT [WHAT]   passes when GOT is an integer <= LIMIT
#   check_cmd NAME COMMAND...        passes when COMMAND succeeds; its output is the diagnostic.
#                                    Returns COMMAND's status; COMMAND runs in a subshell
#   report_tap FILE PREFIX           each "ok N name" / "not ok N name" line of FILE (a guest's
#                                    console; carriage returns dropped) as the test PREFIXname,
#                                    with the "# " lines under it as its diagnostic
#   hold_results                     from now on results are kept back, not printed ...
#   release_results                  ... until this prints and counts them (and stops holding),
#   drop_results                     or this forgets them (a run to be repeated)
#   tally FILE                       counts the result lines FILE holds (the output of a subshell
#                                    that reported them: its numbers go on from ours)
#   report_start WHAT LOGS           names the run for finish
#   finish                           "# WHAT took Ns; logs in LOGS", the totals; exits 0 when no
#                                    test failed, 1 otherwise

N=0 PASSED=0 FAILED=0 SKIPPED=0
VERBOSE="${VERBOSE:-0}"
REPORT_HOLD=0
REPORT_HELD=()
REPORT_WHAT=""
REPORT_LOGS=""
REPORT_T0=$SECONDS

result() {
    if [ "$REPORT_HOLD" = 1 ]; then
        REPORT_HELD+=("$1" "$2" "${3:-}")
        return 0
    fi
    local st="$1" name="$2" diag="${3:-}"
    N=$((N + 1))
    case "$st" in
        ok) PASSED=$((PASSED + 1)); echo "ok $N $name" ;;
        skip) SKIPPED=$((SKIPPED + 1)); echo "ok $N $name # SKIP $diag"; diag="" ;;
        *) FAILED=$((FAILED + 1)); echo "not ok $N $name" ;;
    esac
    if [ -n "$diag" ] && { [ "$st" != ok ] || [ "$VERBOSE" = 1 ]; }; then
        printf '%s\n' "$diag" | sed 's/^/# /'
    fi
    return 0
}

check() {
    if [ "$2" = "$3" ]; then
        result ok "$1" "${4:-value}: '$2'"
    else
        result fail "$1" "${4:-value}: got '$2', expected '$3'"
    fi
}

check_le() {
    if [ -n "$2" ] && [ "$2" -le "$3" ] 2>/dev/null; then
        result ok "$1" "${4:-value}: $2 (limit $3)"
    else
        result fail "$1" "${4:-value}: got '$2', limit $3"
    fi
}

check_cmd() {
    local name="$1" out
    shift
    if out="$("$@" 2>&1)"; then
        result ok "$name" "$out"
    else
        result fail "$name" "$out"
        return 1
    fi
}

report_tap() {
    local line st="" name="" diag=""
    while IFS= read -r line; do
        if [[ "$line" =~ ^(ok|not\ ok)\ [0-9]+\ (.*)$ ]]; then
            local next_st=ok next_name="${BASH_REMATCH[2]}"
            [ "${BASH_REMATCH[1]}" = ok ] || next_st=fail
            [ -n "$name" ] && result "$st" "$2$name" "${diag%$'\n'}"
            st="$next_st" name="$next_name" diag=""
        elif [[ "$line" =~ ^#\ (.*)$ ]] && [ -n "$name" ]; then
            diag+="${BASH_REMATCH[1]}"$'\n'
        fi
    done < <(tr -d '\r' < "$1")
    [ -n "$name" ] && result "$st" "$2$name" "${diag%$'\n'}"
    return 0
}

hold_results() { REPORT_HOLD=1; REPORT_HELD=(); }
drop_results() { REPORT_HELD=(); }
release_results() {
    local kept=("${REPORT_HELD[@]}") i
    REPORT_HOLD=0
    REPORT_HELD=()
    for ((i = 0; i < ${#kept[@]}; i += 3)); do
        result "${kept[i]}" "${kept[i + 1]}" "${kept[i + 2]}"
    done
}

tally() {
    local ok bad skip
    ok="$(grep -c '^ok ' "$1")"
    bad="$(grep -c '^not ok ' "$1")"
    skip="$(grep -c '^ok [0-9]* .* # SKIP' "$1")"
    N=$((N + ok + bad))
    PASSED=$((PASSED + ok - skip))
    FAILED=$((FAILED + bad))
    SKIPPED=$((SKIPPED + skip))
}

report_start() { REPORT_WHAT="$1"; REPORT_LOGS="$2"; REPORT_T0=$SECONDS; }

finish() {
    [ -z "$REPORT_WHAT" ] || echo "# $REPORT_WHAT took $((SECONDS - REPORT_T0))s; logs in $REPORT_LOGS"
    if [ "$SKIPPED" -gt 0 ]; then
        echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
    else
        echo "$PASSED passed, $FAILED failed"
    fi
    [ "$FAILED" -eq 0 ]
    exit $?
}
