"""Base: the packages every later role relies on, time sync (apt and TLS reject signatures and
certificates when the clock is off), and an optional site CA."""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import deploy

from roles.ops import apt_packages, enabled_running, on_change, root_put

# curl + gnupg fetch and dearmor repository keys; git clones Genesis; python3-venv holds
# huggingface_hub; jq is for people debugging daemon.json and the ledger.
BASE_PACKAGES = tuple("ca-certificates curl gnupg git python3 python3-venv jq chrony".split())


@deploy("Base")
def base(ctx: Any) -> None:  # any host's context: its settings have site_ca_files
    apt_packages(name="Install base packages", packages=list(BASE_PACKAGES))
    enabled_running(name="Time sync: chrony enabled and running", service="chrony")
    if not (ca_files := ctx.settings.site_ca_files):
        return
    certs = [root_put(name=f"Site CA certificate {i}", src=src,
                       dest=f"/usr/local/share/ca-certificates/rigfleet-site-{i}.crt")
             for i, src in host.loop(enumerate(ca_files))]
    on_change(name="Refresh the trusted CA bundle", commands=["update-ca-certificates"],
              gates=certs)
