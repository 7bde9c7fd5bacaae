#!/usr/bin/env bash
# The main job on the simulated fleet: bare hosts to serving, a second run that changes
# nothing, the endpoints, then a gated blue/green swap to tq3-mtp-genesis with its report.
# It prints progress lines and a summary; pyinfra's own output goes to a log file it names.
#
#   make demo                  # brings the testbed up first, then runs this
#   bash scripts/demo.sh       # a testbed already up (RIGFLEET_TESTBED_INSTANCE picks which)
#
# Environment: RIGFLEET_TESTBED_INSTANCE (default 0), DEMO_HOST (the swapped host, host1),
# DEMO_LOG (the log file, default reports/demo-<time>.log), RIGFLEET_REACH (default: the
# testbed's published hub and apt ports, so the deploy checks each pin at its source).
set -euo pipefail
case "${1:-}" in
    -h|--help) sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    "") ;;
    *) echo "demo.sh: unknown argument: $1 (allowed: --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

instance="${RIGFLEET_TESTBED_INSTANCE:-0}"
inventory="inventory/testbed.py"
[ "$instance" = 0 ] || inventory="inventory/testbed-${instance}.py"
mkdir -p reports
RIGFLEET_REACH="${RIGFLEET_REACH:-$(python -c 'from rigfleet_testbed import layout
print(" ".join(layout.CONTROL_REACH))')}"
export RIGFLEET_REACH
export DEMO_LOG="${DEMO_LOG:-reports/demo-$(date -u +%Y%m%dT%H%M%SZ).log}"
: > "$DEMO_LOG"
log="$DEMO_LOG"
hosts=$(grep -cE "^ *\('(host|lb)[0-9]+'" "$inventory" || true)

# Run a command with its output in the log; on failure show the log's end and stop.
logged() {
    echo "\$ $*" >> "$log"
    if ! "$@" >> "$log" 2>&1; then
        echo "failed: $*; the end of $log:" >&2
        tail -n 25 "$log" >&2
        exit 1
    fi
}

echo "== 1/5 converge: pyinfra $inventory deploy.py -y (bare hosts -> serving; minutes)"
echo "   pyinfra's output: $log"
started=$SECONDS
logged pyinfra "$inventory" deploy.py -y
converge_s=$((SECONDS - started))
echo "   converged in ${converge_s} s"

echo "== 2/5 a second run (--dry) changes nothing"
dry=$(pyinfra "$inventory" deploy.py --dry 2>&1) || { echo "$dry" >> "$log"; echo "pyinfra --dry failed; see $log" >&2; exit 1; }
echo "$dry" >> "$log"
# pyinfra's table: an operation per row, its last two columns the hosts it would change ("-":
# none); a row with anything else there is shown.
echo "$dry" | awk '/^--> Detected changes/ {on = 1; next} /Detected changes may not/ {on = 0}
    on && NF > 2 && $1 != "Operation" {n++; if ($NF != "-" || $(NF - 1) != "-") {c++; print "   " $0}}
    END {printf "   %d operations checked: %s\n", n, c ? c " would change a host (above)" : "none would change a host"}'

echo "== 3/5 serving endpoints"
rigfleet endpoints --inventory "$inventory"

echo "== 4/5 a gated swap (scripts/demo_swap.sh)"
swap=0
bash scripts/demo_swap.sh || swap=$?

echo "== 5/5 fleet status (host1 now serves tq3-mtp-genesis through --data while the"
echo "   inventory says int8: status reports that host as drifted, exit status 1)"
rigfleet status --inventory "$inventory" || true

echo
echo "== done: ${hosts:-the} host(s) converged from bare to serving in ${converge_s} s, a second"
echo "   run changed nothing, every front answered, and ${DEMO_HOST:-host1}'s swap to"
echo "   tq3-mtp-genesis $([ "$swap" = 0 ] && echo "passed the gate and was promoted" || echo "did not promote (exit $swap)")."
echo "Where to look next:"
echo "   $log                      pyinfra's full output"
echo "   reports/${DEMO_HOST:-host1}/verify-*.md          the gate's reports (JSON beside them)"
echo "   rigfleet status --inventory $inventory     the fleet, one row per host"
echo "   rigfleet bench --inventory $inventory      decode tok/s per host (docs/bench.md)"
echo "   README.md (a real rig), docs/converge.md, docs/swap.md"
echo "   make testbed-down                          remove the simulated fleet"
exit "$swap"
