#!/usr/bin/env bash
# The main job on the simulated fleet: bare hosts to serving, then show the endpoints.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== converge: pyinfra inventory/testbed.py deploy.py"
pyinfra inventory/testbed.py deploy.py -y

echo "== second run: must change nothing"
pyinfra inventory/testbed.py deploy.py -y

echo "== serving endpoints"
rigfleet endpoints --inventory inventory/testbed.py
