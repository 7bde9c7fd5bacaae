#!/usr/bin/env bash
# The end of `make demo`: swap one host to tq3-mtp-genesis through the verify-stress gate
# (stop int8, wait for the cards' memory, start tq3, gate, promote or roll back), then show
# the gate's report and what the host's ledger recorded.
#
#   bash scripts/demo_swap.sh                 # host1 of the testbed (RIGFLEET_TESTBED_INSTANCE)
#   DEMO_HOST=host2 bash scripts/demo_swap.sh
set -euo pipefail
cd "$(dirname "$0")/.."

instance="${RIGFLEET_TESTBED_INSTANCE:-0}"
inventory="inventory/testbed.py"
[ "$instance" = 0 ] || inventory="inventory/testbed-${instance}.py"
host="${DEMO_HOST:-host1}"
pyinfra="${PYINFRA:-pyinfra}"

echo "== swap $host to tq3-mtp-genesis, gated: pyinfra $inventory deploy.py --limit $host --data stack=tq3-mtp-genesis"
before=$(ls -1t "reports/$host"/verify-*.md 2>/dev/null | head -n 1 || true)
status=0
"$pyinfra" "$inventory" deploy.py -y --limit "$host" --data stack=tq3-mtp-genesis \
    > "/tmp/rigfleet-demo-swap.$$.log" 2>&1 || status=$?
grep -E "\[$host\] (swap (plan|front|stop|vram|start|ready|gate: (pass|fail)|promote|rollback|done)|swap:|$host:)" \
    "/tmp/rigfleet-demo-swap.$$.log" || true
if [ "$status" != 0 ]; then
    echo "the swap did not promote (pyinfra exit $status); full log: /tmp/rigfleet-demo-swap.$$.log" >&2
fi

report=$(ls -1t "reports/$host"/verify-*.md 2>/dev/null | head -n 1 || true)
if [ -z "$report" ]; then
    echo "no gate report in reports/$host/: the swap did not reach the gate" >&2
    exit 1
fi
[ "$report" != "$before" ] || echo "(no swap was needed: $host already serves tq3-mtp-genesis; its last report follows)"
echo
echo "== gate report: $report (JSON next to it; on the host: /var/lib/rigfleet/reports/)"
sed -n '1,/^## Failed checks/p' "$report" | sed '/^## Failed checks/d'
echo "== $host: active stack, front route, last ledger line"
"$pyinfra" "$inventory" --limit "$host" -y exec -- \
    "python3 /usr/local/lib/rigfleet/rigfleet-host.pyz status | grep -E '^(active|route):'; tail -n 1 /var/lib/rigfleet/ledger.jsonl" \
    2>&1 | grep -E "^\[$host\] " | grep -vE "Connected|Ready|Success|Error|Loaded|Starting" || true
exit "$status"
