"""The main job: `pyinfra inventory/testbed.py deploy.py -y` takes bare hosts to serving,
a second run changes nothing, and a reboot brings everything back."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from e2e_fleet import CANARY, TMP_WATCH, dry_plan, pyinfra


def post_chat(host, key: str | None, prompt: str = "What is the capital of France?"):
    # Thinking off per request: the single-card stack (seed 004's) leaves it on by default,
    # and 30 tokens of reasoning would leave no answer.
    body = json.dumps({"model": "qwen3.6-27b-autoround", "max_tokens": 30,
                       "messages": [{"role": "user", "content": prompt}],
                       "chat_template_kwargs": {"enable_thinking": False}}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"{host.front_url}/v1/chat/completions", data=body,
                                 headers=headers)
    try:
        with host.urlopen(req, timeout=60) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def container_started_at(host) -> str:
    rc, out = host.sh(f"docker inspect -f '{{{{.State.StartedAt}}}}' {host.container_of_stack}")
    assert rc == 0, out
    return out.strip()


def test_every_host_serves_through_the_front_with_the_key(testbed, converged):
    """Every host, the Debian 12 single-card sudo host with its TLS front included."""
    for host in testbed.hosts:
        status, reply = post_chat(host, testbed.api_key)
        assert status == 200, (host.name, reply)
        assert "Paris" in reply["choices"][0]["message"]["content"]
        status, _ = post_chat(host, None)
        assert status == 401
        status, _ = post_chat(host, "wrong-key")
        assert status == 401


def test_the_sudo_hosts_converge_left_no_secret_in_tmp_that_others_could_read(testbed,
                                                                             converged):
    """inotify on host4's /tmp from bare to serving (``e2e_fleet.converged``): what pyinfra
    and rigfleet put there never holds the API key or the TLS private key readably; the
    watch's own canary (a fake secret, mode 644) shows it would have seen one."""
    sudo = next((h for h in testbed.hosts if h.user != "root"), None)
    if sudo is None:
        pytest.skip("needs the sudo-user host (RIGFLEET_TESTBED_EXTRAS=1)")
    watch = TMP_WATCH[sudo.name]
    assert (CANARY, "0o644") in watch.leaks, watch.seen[:5]
    files = {s.path for s in watch.seen} - {CANARY}
    print(f"{sudo.name}: {len(files)} file(s) in /tmp during the converge: {sorted(files)[:20]}")
    assert files, "the converge of a sudo host put nothing in /tmp: the watch saw nothing"
    assert [leak for leak in watch.leaks if leak[0] != CANARY] == []


def test_second_run_changes_nothing_and_keeps_the_container(testbed, converged):
    before = [container_started_at(h) for h in testbed.hosts]
    changed = [op["name"] for op in dry_plan() if op.get("hosts_with_change")]
    assert changed == [], f"--dry on a converged fleet lists changes: {changed}"
    pyinfra("-y")
    assert [container_started_at(h) for h in testbed.hosts] == before


def test_reboot_brings_back_caps_driver_stack_and_front(testbed, converged):
    host = testbed.hosts[0]
    rc, caps_before = host.sh(
        "nvidia-smi --query-gpu=power.limit --format=csv,noheader,nounits")
    assert rc == 0, caps_before
    host.reboot()
    deadline = time.monotonic() + 240
    while True:
        status, reply = post_chat(host, testbed.api_key)
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert status == 200, reply
    rc, caps_after = host.sh(
        "nvidia-smi --query-gpu=power.limit,persistence_mode --format=csv,noheader,nounits")
    assert rc == 0, caps_after
    assert [line.split(",")[0].strip() for line in caps_after.splitlines()] == [
        c.strip() for c in caps_before.splitlines()]
    assert all(line.split(",")[1].strip() == "Enabled" for line in caps_after.splitlines())
