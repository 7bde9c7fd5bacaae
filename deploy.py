"""The converge: ``pyinfra inventory/home.py deploy.py`` takes each host to serving; a second
run changes nothing, ``--dry`` shows what a run would change (docs/converge.md)."""

from roles import converge
from roles.preflight import run_deploy

run_deploy(converge)
