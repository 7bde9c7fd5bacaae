#!/usr/bin/env bash
# The main job on the simulated fleet: bare hosts to serving, a second run that changes
# nothing, the endpoints, then a gated blue/green swap to tq3-mtp-genesis with its report.
set -euo pipefail
cd "$(dirname "$0")/.."

instance="${RIGFLEET_TESTBED_INSTANCE:-0}"
inventory="inventory/testbed.py"
[ "$instance" = 0 ] || inventory="inventory/testbed-${instance}.py"

echo "== converge: pyinfra $inventory deploy.py -y (bare hosts -> serving)"
started=$SECONDS
pyinfra "$inventory" deploy.py -y
echo "converge took $((SECONDS - started)) s"

echo "== what a second run would change (--dry): nothing"
pyinfra "$inventory" deploy.py --dry 2>&1 | sed -n '/Detected changes/,$p'

echo "== serving endpoints"
rigfleet endpoints --inventory "$inventory"

bash scripts/demo_swap.sh

echo "== fleet status (compared with the inventory: host1 now serves tq3-mtp-genesis through"
echo "   --data, while the inventory says int8, so status reports that host as drifted)"
rigfleet status --inventory "$inventory" || true
