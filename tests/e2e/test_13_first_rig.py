"""The README's first-rig path, walked by a user on a fresh Debian control machine.

A container from the testbed's debootstrapped base image, on the testbed's network, is the
user's laptop (a user ``alice`` with sudo; the machine's proxy CA trusted, as a site's laptops
are). A fresh bare host (``host9``, outside the session inventory) is the rig, reached at its
address. The commands are the README's own, read from its "Your first rig" section: a README
that drifts from what works breaks this test. What the test does instead of the user:
``git clone`` is a copy of the working tree; ``ssh-copy-id`` (the twin's rigs have no password)
is the console putting alice's key on the rig; the inventory's edit sets the rig's address and
the README's mirror keys to the twin's sources (the values ``testbed up`` writes into its own
inventory); pyinfra's prompt is answered with ``-y``. The twin's Genesis repository holds
other commits than GitHub's (real Genesis cannot patch the simulator), so the copy's pins name
the twin's commit of the same release, as ``testbed up`` does for its own pins.
"""

from __future__ import annotations

import re
import runpy
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from pprint import pformat

import pytest
import yaml
from e2e_fleet import INVENTORY, KEEP, REPO, STATE, fresh_host, remove_host, wait_for

README = REPO / "README.md"
USER = "alice"
HOME = f"/home/{USER}"
CHECKOUT = f"{HOME}/rigfleet"
RIG_SLOT = 9  # host9: outside every session layout (1..HOSTS+1)
README_ADDRESS = "192.168.1.41"
# Keys the twin sets in the user's inventory: where hosts get software (the README's mirror
# keys), and what differs in the twin's hardware (the simulators decode sim_speedup times
# faster than a rig, on a shared machine: the testbed inventory's own gate settings).
MIRROR_KEYS = ("docker_registry_mirror", "hf_endpoint", "runtime_pip_index_url", "apt_repos",
               "bump_registry")
TWIN_KEYS = ("throughput_scale", "gate_profile", "gate_set")


def first_rig_steps(text: str) -> dict[int, list[str]]:
    """The README's first-rig section: step number -> the lines of its ``sh`` blocks."""
    start = text.index("## Your first rig")
    end = text.index("\n## ", start + 1)
    steps: dict[int, list[str]] = {}
    current = 0
    in_block = False
    for line in text[start:end].splitlines():
        m = re.match(r"\*\*(\d+)\. ", line)
        if m and not in_block:
            current = int(m.group(1))
        elif line.startswith("```"):
            in_block = not in_block
        elif in_block:
            steps.setdefault(current, []).append(line)
    return steps


def first_rig_section() -> str:
    text = README.read_text()
    start = text.index("## Your first rig")
    return text[start:text.index("\n## ", start + 1)]


def docker(*args: str, input: str | None = None, timeout: float = 900,
           check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["docker", *args], input=input, text=True, capture_output=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {args[:3]} exited {proc.returncode}\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


class Laptop:
    """The control machine: commands run as alice, in a login-like bash, each step timed."""

    def __init__(self, container: str) -> None:
        self.container = container
        self.outputs: list[str] = []

    def run(self, title: str, script: str, user: str = USER, timeout: float = 900,
            input: str | None = None, quiet: bool = False) -> str:
        """Run ``script``; its output is printed (its tail) and kept, unless ``quiet``."""
        print(f"--- {title}\n" + "\n".join(f"$ {ln}" for ln in script.splitlines()), flush=True)
        started = time.monotonic()
        proc = docker("exec", "-i", "-u", user, "-w", HOME if user == USER else "/",
                      "-e", f"HOME={HOME if user == USER else '/root'}", "-e", "COLUMNS=120",
                      self.container, "bash", "-eo", "pipefail", "-c", script,
                      input=input, timeout=timeout, check=False)
        out = proc.stdout + proc.stderr
        if not quiet:
            self.outputs.append(out)
            print("\n".join(out.rstrip().splitlines()[-12:]))
        print(f"--- {title}: {time.monotonic() - started:.1f}s, exit {proc.returncode}",
              flush=True)
        assert proc.returncode == 0, f"{title} exited {proc.returncode}:\n{out[-6000:]}"
        return out

    def step(self, title: str, lines: list[str], timeout: float = 900) -> str:
        """README lines run in the checkout with the venv active (a user's shell after step 1)."""
        return self.run(title, "cd ~/rigfleet && . .venv/bin/activate\n" + "\n".join(lines),
                        timeout=timeout)


def bare(line: str) -> str:
    """A README command without its trailing comment."""
    return re.sub(r"\s+#.*$", "", line)


def replaced(lines: list[str], old: str, new: str) -> list[str]:
    """``lines`` with ``old`` replaced, which must be there (the README drifted otherwise)."""
    assert any(old in ln for ln in lines), f"README first-rig step lost {old!r}: {lines}"
    return [ln.replace(old, new) for ln in lines]


@pytest.fixture(scope="module")
def twin(testbed):
    """A fresh bare rig (host9) and the user's laptop, on the testbed's network; removed after."""
    from rigfleet_testbed import layout

    slot = fresh_host(testbed, RIG_SLOT)
    laptop_name = f"{slot.container.rsplit('-', 1)[0]}-laptop"
    laptop_ip = layout.GATEWAY.rsplit(".", 1)[0] + ".50"
    # Fresh too, also when RIGFLEET_KEEP_TESTBED=1 kept the last run's.
    docker("rm", "-f", laptop_name, check=False)
    docker("run", "-d", "--name", laptop_name, "--hostname", "laptop",
           "--label", f"{layout.LABEL}={layout.LABEL_VALUE}",
           "--network", layout.NETWORK, "--ip", laptop_ip,
           layout.DEFAULT_OS.base_image, "sleep", "infinity")
    try:
        yield slot, Laptop(laptop_name)
    finally:
        if not KEEP:
            docker("rm", "-f", laptop_name, check=False)
            remove_host(slot)


def user_inventory(home_py: str, address: str) -> str:
    """inventory/home.py edited for one rig: its address, int8 only, and the twin's sources."""
    ns = runpy.run_path(str(REPO / "inventory" / "home.py"))
    testbed_ns = runpy.run_path(str(INVENTORY))
    name, data = ns["gpu_hosts"][0]
    shared = testbed_ns["_testbed_data"]
    data = {**data, "ssh_hostname": address, "stack": "int8", "stacks": ["int8"],
            **{k: shared[k] for k in MIRROR_KEYS}}
    # The testbed's control side asks the registry at a published loopback port; the laptop,
    # on the network, asks it where the rigs do.
    data["bump_registry"] = shared["docker_registry_mirror"]
    host_data = testbed_ns["gpu_hosts"][0][0][1]
    data |= {k: host_data[k] if k in host_data else shared[k] for k in TWIN_KEYS}
    doc = home_py.split('"""')[1]
    return (f'"""{doc}"""\n\ngpu_hosts = [\n    ({name!r}, {pformat(data, indent=4, width=96)}),\n'
            f"]\n\ncanary = [{name!r}]\n")


def twin_pins(shipped: str) -> str:
    """The shipped pins (digests unresolved) with each Genesis pin naming the twin's commit of
    the same release, and the model at its known-good upload (both from the testbed's
    generated pins).

    The twin's hub has main on a later re-quantised upload that lost long-context recall (the
    gate's needles fail on it, and the converge rolls back): the user, as the README's step 5
    says, writes the known-good commit as ``model.revision`` before locking.
    """
    pins = yaml.safe_load(shipped)
    twin = yaml.safe_load((STATE / "pins.yaml").read_text())
    for name, stack in pins["stacks"].items():
        if stack.get("genesis"):
            stack["genesis"] = twin["stacks"][name]["genesis"]
    assert pins["model"]["revision"] == "unresolved", pins["model"]
    pins["model"]["revision"] = twin["model"]["revision"]
    return yaml.safe_dump(pins, sort_keys=False)


def test_the_readmes_first_rig_path_takes_a_bare_host_to_serving(testbed, twin):
    slot, laptop = twin
    steps = first_rig_steps(README.read_text())
    assert {1, 2, 3, 5, 6, 7, 8, 9} <= set(steps), sorted(steps)  # 4 edits a file
    section = first_rig_section()
    for key in MIRROR_KEYS + ("--registry", "--hub"):
        assert key in section, f"README first-rig path does not document {key}"
    started = time.monotonic()

    # The machine as alice finds it: sudo, the site's CA (the proxy's), apt's lists.
    cas = "".join(p.read_text() for p in
                  sorted(Path("/usr/local/share/ca-certificates").glob("*.crt")))
    laptop.run("laptop: sudo, the site CA, apt lists (not the README's)",
               "apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "
               "sudo ca-certificates >/dev/null\n"
               "cat > /usr/local/share/ca-certificates/site.crt\n"
               "update-ca-certificates >/dev/null\n"
               f"useradd -m -s /bin/bash {USER}\n"
               f"echo '{USER} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/{USER}", user="root",
               input=cas)

    # 1. Install; the clone is a copy of this working tree (tracked and new files).
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout
    tar = subprocess.run(["tar", "-c", "--null", "-T", "-"], cwd=REPO, input=files,
                         capture_output=True, check=True).stdout
    subprocess.run(["docker", "exec", "-i", "-u", USER, laptop.container, "sh", "-c",
                    f"mkdir -p {CHECKOUT} && tar -x -C {CHECKOUT}"], input=tar, check=True)
    install = replaced(steps[1], "git clone <this repository> rigfleet && cd rigfleet",
                       "cd rigfleet")
    out = laptop.run("1. install", "\n".join(install), timeout=900)
    assert re.search(r"rigfleet \d+\.\d+", out), out[-2000:]

    # 2. The API key, in a file.
    laptop.step("2. the API key", steps[2])
    key = laptop.run("(reading the key for the outside check)",
                     "cat ~/.config/rigfleet/api-key; stat -c %a ~/.config/rigfleet/api-key",
                     quiet=True)
    api_key, mode = key.split()
    assert mode == "600" and len(api_key) >= 32

    # 3. SSH: the console puts alice's key on the rig (ssh-copy-id needs a password).
    ssh = replaced(steps[3], README_ADDRESS, slot.ip)
    copy_id = [ln for ln in ssh if ln.startswith("ssh-copy-id")]
    assert copy_id, ssh
    keygen = [ln for ln in ssh if "ssh-keygen" in ln]
    laptop.step("3a. an SSH key", keygen)
    pub = laptop.run("(the public key, for the rig's console)", "cat ~/.ssh/id_ed25519.pub")
    docker("exec", "-i", slot.container, "sh", "-c",
           "cat >> /root/.ssh/authorized_keys", input=pub)
    laptop.step("3b. host key, login", [ln for ln in ssh if ln not in copy_id + keygen])

    # 4. The inventory: the rig's address and the twin's sources (the README's mirror keys).
    home_py = (REPO / "inventory" / "home.py").read_text()
    laptop.run("4. edit inventory/home.py", f"cat > {CHECKOUT}/inventory/home.py",
               input=user_inventory(home_py, slot.ip))
    laptop.run("(pins: Genesis at the twin's commit; the model's known-good upload)",
               f"cat > {CHECKOUT}/pins.yaml", input=twin_pins((REPO / "pins.yaml").read_text()))

    lock = [ln for ln in steps[5] if ln.startswith("rigfleet pins lock")]
    assert lock, steps[5]
    shared = runpy.run_path(str(INVENTORY))["_testbed_data"]
    mirrors = f" --registry {shared['docker_registry_mirror']} --hub {shared['hf_endpoint']}"
    out = laptop.step("5. lock the pins (through the mirrors)", [bare(lock[0]) + mirrors])
    assert "stacks.int8.digest: unresolved -> sha256:" in " ".join(out.split()), out[-3000:]
    laptop.step("6. check", steps[6])

    converge = [ln for ln in steps[7] if ln.startswith("pyinfra inventory/home.py deploy.py")]
    assert converge, steps[7]
    laptop.step("7. converge (answering the prompt: -y)", [bare(converge[0]) + " -y"], timeout=1500)

    verify = replaced(steps[8], README_ADDRESS, slot.ip)
    laptop.step("8. verify", verify, timeout=900)
    out = laptop.step("9. status", steps[9])
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("rig-a ")]
    # status: serving int8, the gate passed, no drift; endpoints: the front answered 200.
    assert any(r[1] == "int8" and "pass" in r and r[-1] == "none" for r in rows), out[-3000:]
    assert any(r[1] == "200" for r in rows), out[-3000:]

    # From outside: the rig serves through its front, with the key, and only with it.
    front = f"http://127.0.0.1:{slot.front_port}/v1/models"

    def answers() -> bool:
        req = urllib.request.Request(front, headers={"Authorization": f"Bearer {api_key}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status == 200 and b"data" in r.read()
        except (urllib.error.URLError, OSError):
            return False

    wait_for(answers, 30, "the rig's front answering with the key")
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(front, timeout=10)
    assert denied.value.code == 401
    assert not any(api_key in out for out in laptop.outputs), "the API key was printed"
    print(f"first-rig walk-through: {time.monotonic() - started:.1f}s")
