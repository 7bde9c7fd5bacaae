#!/usr/bin/env bash
# The end of `make demo`: swap one host to tq3-mtp-genesis through the verify-stress gate
# (stop int8, wait for the cards' memory, start tq3, gate, promote or roll back), then show
# the gate's verdict and what the host's ledger recorded. pyinfra's output goes to a log.
#
#   bash scripts/demo_swap.sh                 # host1 of the testbed (RIGFLEET_TESTBED_INSTANCE)
#   DEMO_HOST=host2 bash scripts/demo_swap.sh
#
# Environment: DEMO_HOST, DEMO_LOG (the log file; default /tmp/rigfleet-demo-swap.<pid>.log),
# PYINFRA (the pyinfra command).
set -euo pipefail
case "${1:-}" in
    -h|--help) sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    "") ;;
    *) echo "demo_swap.sh: unknown argument: $1 (allowed: --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

instance="${RIGFLEET_TESTBED_INSTANCE:-0}"
inventory="inventory/testbed.py"
[ "$instance" = 0 ] || inventory="inventory/testbed-${instance}.py"
host="${DEMO_HOST:-host1}"
pyinfra="${PYINFRA:-pyinfra}"
log="${DEMO_LOG:-/tmp/rigfleet-demo-swap.$$.log}"

echo "== swap $host to tq3-mtp-genesis, gated: pyinfra $inventory deploy.py --limit $host --data stack=tq3-mtp-genesis"
echo "   pyinfra's output: $log"
before=$(ls -1t "reports/$host"/verify-*.md 2>/dev/null | head -n 1 || true)
status=0
seen=$(wc -l < "$log" 2>/dev/null || echo 0)  # the log may hold earlier runs (make demo's)
"$pyinfra" "$inventory" deploy.py -y --limit "$host" --data stack=tq3-mtp-genesis \
    >> "$log" 2>&1 || status=$?
tail -n "+$((seen + 1))" "$log" | grep -E \
    "\[$host\] (swap (plan|front|stop|vram|start|ready|gate: (pass|fail)|promote|rollback|done)|swap:|$host:)" \
    | sed 's/^/   /' || true
if [ "$status" != 0 ]; then
    echo "the swap did not promote (pyinfra exit $status); full log: $log" >&2
fi

report=$(ls -1t "reports/$host"/verify-*.md 2>/dev/null | head -n 1 || true)
if [ -z "$report" ]; then
    echo "no gate report in reports/$host/: the swap did not reach the gate" >&2
    exit 1
fi
[ "$report" != "$before" ] || echo "(no swap was needed: $host already serves tq3-mtp-genesis; its last report follows)"
echo "== gate report: $report (JSON next to it; on the host: /var/lib/rigfleet/reports/)"
grep -E '^# verify-stress gate|^- (Checks|Profile):' "$report" | sed 's/^/   /'
grep -E '^\| [0-9]+ \|.*\*\*FAIL' "$report" | sed 's/^/   failed: /' || true
echo "== $host: active stack, front route, the ledger's last event"
# The ledger's last line, summed up on the host (its full JSON is in the log).
summary='import json; d = json.loads(open("/var/lib/rigfleet/ledger.jsonl").readlines()[-1]); g = d.get("gate") or {}; print("ledger:", d.get("time"), d.get("event"), d.get("result"), "stack", d.get("stack"), "gate", g.get("result", "-"))'
shown=$("$pyinfra" "$inventory" --limit "$host" -y exec -- \
    "python3 /usr/local/lib/rigfleet/rigfleet-host.pyz status | grep -E '^(active|route):'; python3 -c '$summary'; tail -n 1 /var/lib/rigfleet/ledger.jsonl" \
    2>&1 || true)
echo "$shown" >> "$log"
echo "$shown" | grep -E "^\[$host\] (active|route|ledger):" | sed 's/^/   /' || true
exit "$status"
