"""Fleet status: one row per host, what it runs and whether it drifted from the inventory + pins.

    rigfleet status --inventory inventory/home.py [--json] [--timeout 20]

For every host, concurrently, one SSH connection (paramiko; host keys checked against the
inventory's ``ssh_known_hosts_file``) runs one host-side stdlib Python snippet (``PROBE``) that
reads everything at once and prints JSON: ``state.json`` and the ledger's last line, the last
gate report, ``nvidia-smi`` power limits, the stack containers and their images' digests, the
Genesis HEAD, the weights manifest (size + mtime of every file, no hashing), and the front's
answer with and without the API key. The control side then decides drift from that data
(``find_drift``, pure) against what the inventory and the pins say (``expected_state``).

Exit status: 0 when every host is reachable and nothing drifted, 1 when some host drifted,
2 when some host is unreachable (or its inventory data is invalid), 3 when the inventory or
the pins cannot be read.

Example::

    from rigfleet.inventory import load_inventory
    from rigfleet.status import fleet_status, render_table

    rows = fleet_status(load_inventory("inventory/home.py"))
    [r.host for r in rows if r.drift]           # hosts that differ from inventory + pins
    rich.console.Console().print(render_table(rows))

The testinfra suite (``tests/hosts``) reuses ``expected_state`` so both read the same truth.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rigfleet.catalog import STACKS, get_stack
from rigfleet.commands.probe import AUTH_HEADER_FILE
from rigfleet.compose import CONFIG_HASH_LABEL, GENESIS_HOST_DIR, SERVICE, compose_document
from rigfleet.endpoints import front_url
from rigfleet.errors import RigfleetError
from rigfleet.hostdata import HostSettings, validate_host
from rigfleet.inventory import InventoryHost
from rigfleet.pins import GenesisPin, Pins, load_pins

# Host layout (docs/converge.md; written by roles/ledger.py, roles/power.py, the fetcher).
STATE_FILE = "/var/lib/rigfleet/state.json"
LEDGER_FILE = "/var/lib/rigfleet/ledger.jsonl"
REPORTS_DIR = "/var/lib/rigfleet/reports"
ACTIVE_FILE = "/var/lib/rigfleet/active/active.json"
# The front's route (rigfleet/hostside/front.py): first line "# rigfleet route: <stack>/<hash>".
ROUTE_FILE = "/etc/nginx/rigfleet/route.conf"
ROUTE_MARK = "# rigfleet route: "
POWER_CAPS_UNIT = "rigfleet-power-caps.service"
MANIFEST_NAME = ".rigfleet-manifest.json"

# What roles/ledger.py records in state.json and in each ledger line (``desired_state``).
TRACKED_KEYS = (
    "stack", "image", "digest", "vllm_version", "genesis_commit", "model_repo",
    "model_revision", "driver_branch", "toolkit_version", "pins_serial",
)  # fmt: skip

# nvidia-smi prints limits with two decimals; a set limit reads back within a watt.
CAP_TOLERANCE_W = 0.5

GPU_FIELDS = ("index", "driver_version", "power.limit", "persistence_mode")

REPO_ROOT = Path(__file__).resolve().parent.parent

EXIT_OK, EXIT_DRIFT, EXIT_UNREACHABLE, EXIT_ERROR = 0, 1, 2, 3


# --- what a host should be -------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """What inventory data + pins say one host runs (the deploy's view of the host).

    + genesis: the checkout the deploy keeps on the host (the active stack's Genesis, else any
      pinned stack's, as ``roles.preflight.HostContext.genesis``); None when no stack uses it
    + stack_genesis: the Genesis the active stack itself runs with (None for int8)
    + config_hash: the ``io.rigfleet.config-hash`` label of the stack's rendered compose file
    + tracked: the ``state.json`` / ledger values the deploy records (``TRACKED_KEYS``)
    """

    host: str
    stack: str
    container: str
    other_containers: tuple[str, ...]
    stack_port: int
    served_model_name: str
    image: str
    repository: str
    digest: str
    vllm_version: str
    genesis: GenesisPin | None
    stack_genesis: GenesisPin | None
    model_repo: str
    model_revision: str
    model_path: str
    power_caps_w: tuple[int, ...]
    gpu_count: int
    driver_branch: str
    driver_version: str | None
    toolkit_version: str
    front_port: int
    front_url: str
    api_key_file: str
    pins_path: str
    config_hash: str = ""
    tracked: dict[str, Any] = field(default_factory=dict)

    @property
    def route_id(self) -> str:
        """What the front's route file names when it proxies to this stack."""
        return f"{self.stack}/{self.config_hash}"


def resolve_pins_path(pins_file: str, base: Path | None = None) -> Path:
    """The pins file named by host data: absolute as is, relative to the repository root.

    pyinfra runs from the repository root, so that is what a relative ``pins_file`` means; the
    working directory is tried first for an installed (non-editable) rigfleet.
    """
    path = Path(pins_file).expanduser()
    if path.is_absolute():
        return path
    if base is not None:
        return base / path
    cwd = Path.cwd() / path
    return cwd if cwd.exists() else REPO_ROOT / path


_PINS: dict[str, Pins] = {}


def _pins(path: Path) -> Pins:
    # Every host usually names the same file: parse it once per process.
    key = str(path.resolve())
    if key not in _PINS:
        _PINS[key] = load_pins(path)
    return _PINS[key]


def checkout_genesis(pins: Pins, stack: str) -> GenesisPin | None:
    """The Genesis checkout the deploy keeps: the stack's own, else the first pinned one's."""
    own = pins.stacks[stack].genesis
    if own is not None:
        return own
    for name, pinned in pins.stacks.items():
        if name in STACKS and pinned.genesis is not None:
            return pinned.genesis
    return None


def settings_and_pins(
    host: InventoryHost, pins_base: Path | None = None
) -> tuple[HostSettings, Pins]:
    """The host's validated settings and the pins it runs, as the deploy's preflight reads
    them (``validate_host``, then the ``pins_file`` its data names, ``for_host(name)``).

    Raises ``RigfleetError`` (``HostDataError``, ``PinsError``) with the deploy's own message.
    """
    settings = validate_host(host.name, host.data)
    pins = _pins(resolve_pins_path(settings.pins_file, pins_base))
    # A rollout may leave a host on other pins (the pins file's ``hosts`` section).
    return settings, pins.for_host(host.name)


def expected_state(host: InventoryHost, pins_base: Path | None = None) -> Expected:
    """What ``host`` should run, from its inventory data and the pins its data names.

    Raises ``RigfleetError`` (``HostDataError``, ``PinsError``) with the deploy's own message
    when the data or the pins are invalid.

    + host: one entry of ``rigfleet.inventory.load_inventory``
    + pins_base: directory a relative ``pins_file`` is relative to (default: repository root)

    **Example:**

    .. code:: python

        exp = expected_state(load_inventory("inventory/home.py")[0])
        exp.power_caps_w, exp.digest
    """
    settings, pins = settings_and_pins(host, pins_base)
    return expected_from(host, settings, pins)


def expected_from(host: InventoryHost, settings: HostSettings, pins: Pins) -> Expected:
    """``expected_state`` from already validated settings and the host's pins (pure)."""
    pinned = pins.stack(settings.stack)
    spec = get_stack(settings.stack)
    others = tuple(
        get_stack(n).container_name for n in pins.stacks if n in STACKS and n != settings.stack
    )
    tracked = {
        "stack": settings.stack,
        "image": pinned.image,
        "digest": pinned.digest,
        "vllm_version": pinned.vllm_version,
        "genesis_commit": pinned.genesis.commit if pinned.genesis is not None else None,
        "model_repo": pins.model.repo,
        "model_revision": pins.model.revision,
        "driver_branch": pins.driver_branch,
        "toolkit_version": pins.toolkit_version,
        "pins_serial": pins.serial,
    }
    return Expected(
        host=host.name,
        stack=settings.stack,
        container=spec.container_name,
        other_containers=others,
        stack_port=spec.port,
        served_model_name=spec.served_model_name,
        image=pinned.image,
        repository=pinned.repository,
        digest=pinned.digest,
        vllm_version=pinned.vllm_version,
        genesis=checkout_genesis(pins, settings.stack),
        stack_genesis=pinned.genesis,
        model_repo=pins.model.repo,
        model_revision=pins.model.revision,
        model_path=f"{settings.model_dir.rstrip('/')}/{pins.model.local_dir}",
        power_caps_w=tuple(settings.power_caps_w),
        gpu_count=settings.gpu_count,
        driver_branch=pins.driver_branch,
        driver_version=pins.driver_version,
        toolkit_version=pins.toolkit_version,
        front_port=settings.front_port,
        front_url=front_url(host),
        api_key_file=settings.api_key_file,
        pins_path=pins.path,
        config_hash=str(
            compose_document(spec, pins, settings)["services"][SERVICE]["labels"][CONFIG_HASH_LABEL]
        ),
        tracked=tracked,
    )


# --- the host-side probe ---------------------------------------------------------------------

# Runs as `python3 - '<params json>'` (script on stdin), stdlib only, Python >= 3.8, as root
# (the auth header file is root-only). Every part catches its own failure: absence is data.
PROBE = r"""
import json, os, subprocess, sys, urllib.error, urllib.request
P = json.loads(sys.argv[1])
out = {"errors": []}

def run(cmd, timeout=10):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr.strip()
    except OSError as e:
        return 127, "", str(e)
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %ss" % timeout

def read_json(path):
    try:
        with open(path) as f:
            return json.load(f), None
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as e:
        return None, str(e)

out["state"], out["state_error"] = read_json(P["state_file"])
active, _ = read_json(P["active_file"])
out["active"] = active.get("ref") if isinstance(active, dict) else None
try:
    with open(P["route_file"]) as f:
        first = f.readline().strip()
    mark = P["route_mark"]
    out["route"] = first[len(mark):].strip() if first.startswith(mark) else None
except OSError:
    out["route"] = None

def ledger_tail(path):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
    except FileNotFoundError:
        return None, "missing"
    except OSError as e:
        return None, str(e)
    if not lines:
        return None, "empty"
    try:
        return json.loads(lines[-1].decode()), None
    except ValueError as e:
        return None, "last line is not JSON (%s)" % e
out["ledger_last"], out["ledger_error"] = ledger_tail(P["ledger_file"])

def last_report(d):
    try:
        names = [n for n in os.listdir(d) if n.endswith(".json") and not n.startswith(".")]
    except OSError:
        return None
    if not names:
        return None
    name = max(names, key=lambda n: os.path.getmtime(os.path.join(d, n)))
    path = os.path.join(d, name)
    report = {"file": path, "mtime": os.path.getmtime(path)}
    data, _ = read_json(path)
    if isinstance(data, dict):
        report["data"] = {k: data[k] for k in data if not isinstance(data[k], (dict, list))}
    return report
out["last_report"] = last_report(P["reports_dir"])

rc, so, se = run(["nvidia-smi", "--query-gpu=" + ",".join(P["gpu_fields"]),
                  "--format=csv,noheader,nounits"])
out["gpu"] = {"rc": rc, "stdout": so, "stderr": se[-500:]}
rc, so, se = run(["systemctl", "is-enabled", P["caps_unit"]])
out["caps_unit_enabled"] = so.strip() or se[-200:]

containers = {}
rc, so, se = run(["docker", "inspect", "--type", "container"] + P["containers"])
try:
    found = json.loads(so) if so.strip() else []
except ValueError:
    found = []
if rc != 0 and not found and "No such" not in se:
    out["errors"].append("docker inspect: " + (se[-300:] or "exit %d" % rc))
for c in found:
    name = c.get("Name", "").lstrip("/")
    st = c.get("State") or {}
    cfg = c.get("Config") or {}
    info = {"status": st.get("Status"), "image_id": c.get("Image"),
            "config_image": cfg.get("Image"), "labels": cfg.get("Labels") or {},
            "started_at": st.get("StartedAt"), "restarts": c.get("RestartCount")}
    r2, s2, _ = run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}",
                     c.get("Image", "")])
    try:
        info["repo_digests"] = json.loads(s2) if r2 == 0 else []
    except ValueError:
        info["repo_digests"] = []
    containers[name] = info
out["containers"] = containers

g = P["genesis_dir"]
if os.path.isdir(g):
    git = ["git", "-c", "safe.directory=*", "-C", g]
    rc, so, se = run(git + ["rev-parse", "--verify", "-q", "HEAD"])
    r2, s2, _ = run(git + ["remote", "get-url", "origin"])
    out["genesis"] = {"head": so.strip() or None, "origin": s2.strip() or None,
                      "error": se[-300:] if rc else None}
else:
    out["genesis"] = None

m, err = read_json(os.path.join(P["model_path"], P["manifest_name"]))
if isinstance(m, dict):
    reason = "matches manifest"
    files = m.get("files") if isinstance(m.get("files"), dict) else {}
    if not files:
        reason = "manifest lists no files"
    for name in sorted(files):
        meta = files[name] if isinstance(files[name], dict) else {}
        try:
            st = os.stat(os.path.join(P["model_path"], name))
        except OSError:
            reason = "%s is missing" % name
            break
        if st.st_size != meta.get("size"):
            reason = "%s has %d bytes, manifest says %s" % (name, st.st_size, meta.get("size"))
            break
        if abs(st.st_mtime - float(meta.get("mtime", 0))) > 0.001:
            reason = "%s was modified after it was verified" % name
            break
    out["manifest"] = {"repo": m.get("repo"), "revision": m.get("revision"),
                       "intact": reason == "matches manifest", "reason": reason}
else:
    out["manifest"] = {"error": err}

def get(url, header=None):
    req = urllib.request.Request(url)
    if header:
        k, _, v = header.partition(":")
        req.add_header(k.strip(), v.strip())
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except Exception as e:
        return None, "%s: %s" % (type(e).__name__, e)

base = "http://127.0.0.1:%d/v1/models" % P["front_port"]
front = {}
front["no_key"], _ = get(base)
try:
    with open(P["auth_header_file"]) as f:
        header = f.read().strip()
except OSError as e:
    header = None
    front["error"] = "cannot read %s (%s)" % (P["auth_header_file"], e.strerror)
if header:
    code, body = get(base, header)
    front["with_key"] = code
    try:
        front["models"] = [str(x.get("id")) for x in json.loads(body).get("data", [])]
    except (ValueError, AttributeError):
        front["models"] = []
        if code is None:
            front["error"] = body
out["front"] = front
print(json.dumps(out))
"""


def probe_params(exp: Expected) -> dict[str, Any]:
    """The probe's parameters for one host (no secrets: the key stays in its host file)."""
    return {
        "state_file": STATE_FILE,
        "active_file": ACTIVE_FILE,
        "route_file": ROUTE_FILE,
        "route_mark": ROUTE_MARK,
        "ledger_file": LEDGER_FILE,
        "reports_dir": REPORTS_DIR,
        "gpu_fields": list(GPU_FIELDS),
        "caps_unit": POWER_CAPS_UNIT,
        "containers": [exp.container, *exp.other_containers],
        "genesis_dir": GENESIS_HOST_DIR,
        "model_path": exp.model_path,
        "manifest_name": MANIFEST_NAME,
        "front_port": exp.front_port,
        "auth_header_file": AUTH_HEADER_FILE,
    }


def probe_command(exp: Expected, sudo: bool = False) -> str:
    """The remote command; the script itself goes to its stdin."""
    cmd = f"python3 - {shlex.quote(json.dumps(probe_params(exp), separators=(',', ':')))}"
    return f"sudo -n {cmd}" if sudo else cmd


# --- SSH -------------------------------------------------------------------------------------


class HostUnreachable(RigfleetError):
    """SSH to the host failed (connection, host key, auth, timeout); the message says which."""


def ssh_client(host: InventoryHost, timeout: float) -> Any:
    """A connected paramiko client using the inventory's SSH data, host keys checked.

    Host keys come only from ``ssh_known_hosts_file`` when the data sets it (else the user's
    ``~/.ssh/known_hosts``). An unknown host is refused unless the data says
    ``ssh_strict_host_key_checking`` is ``no`` or ``accept-new`` (then accepted for this run,
    never written); a host whose key *differs* from the file is always refused.
    """
    import paramiko

    hostname, port, user = host.ssh_target
    data = host.data
    client = paramiko.SSHClient()
    known = data.get("ssh_known_hosts_file")
    try:
        if known:
            client.load_host_keys(str(Path(str(known)).expanduser()))
        else:
            client.load_system_host_keys()
    except OSError as e:
        raise HostUnreachable(f"cannot read known hosts {known}: {e.strerror}") from None
    strict = str(data.get("ssh_strict_host_key_checking", "yes")).lower()
    if strict in ("no", "off", "false", "accept-new"):
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    key = data.get("ssh_key")
    try:
        client.connect(
            hostname,
            port=port,
            username=user,
            key_filename=str(Path(str(key)).expanduser()) if key else None,
            passphrase=data.get("ssh_key_password"),
            password=data.get("ssh_password"),
            allow_agent=not key,
            look_for_keys=not key,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
        )
    except paramiko.BadHostKeyException as e:
        client.close()
        raise HostUnreachable(
            f"host key of {hostname}:{port} differs from {known or 'known_hosts'} ({e})"
        ) from None
    except paramiko.SSHException as e:
        client.close()
        if "not found in known_hosts" in str(e):
            raise HostUnreachable(
                f"{hostname}:{port} is not in {known or '~/.ssh/known_hosts'} (strict host "
                "key checking); add it (ssh-keyscan) or fix ssh_known_hosts_file"
            ) from None
        raise HostUnreachable(f"ssh {user}@{hostname}:{port}: {e}") from None
    except OSError as e:
        client.close()
        raise HostUnreachable(f"ssh {user}@{hostname}:{port}: {e.strerror or e}") from None
    return client


def run_probe(host: InventoryHost, exp: Expected, timeout: float) -> dict[str, Any]:
    """Connect, run ``PROBE`` once, return its JSON; raises ``HostUnreachable``."""
    client = ssh_client(host, timeout)
    try:
        transport = client.get_transport()
        assert transport is not None
        chan = transport.open_session(timeout=timeout)
        chan.settimeout(timeout)
        # One stream: the probe's JSON is its last stdout line; anything else is the reason.
        chan.set_combine_stderr(True)
        chan.exec_command(probe_command(exp, sudo=bool(host.data.get("_sudo"))))
        chan.sendall(PROBE.encode())
        chan.shutdown_write()
        out = bytearray()
        try:
            while chunk := chan.recv(65536):
                out += chunk
        except TimeoutError:
            raise HostUnreachable(f"no answer within {timeout:g}s") from None
        rc = chan.recv_exit_status()
    finally:
        client.close()
    text = out.decode(errors="replace").strip()
    try:
        return dict(json.loads(text.splitlines()[-1]))
    except (ValueError, IndexError, TypeError):
        detail = text[-300:] or f"exit {rc}"
        raise HostUnreachable(f"the status probe failed on the host: {detail}") from None


# --- drift decisions -------------------------------------------------------------------------


_HEXLIKE = re.compile(r"(?:sha256:)?[0-9a-f]{40,64}")


def _short(value: str | None, n: int = 12) -> str:
    """Digests and commits shortened for a message (``sha256:`` kept); other values whole."""
    if not value:
        return "-"
    if not _HEXLIKE.fullmatch(value):
        return value
    return value[: 7 + n] if value.startswith("sha256:") else value[:n]


def _hex(value: str | None, n: int = 8) -> str:
    """A digest or commit shortened for a table cell (``sha256:`` dropped)."""
    return value.removeprefix("sha256:")[:n] if value else "-"


def _when(iso: str | None) -> str:
    """``2026-11-29T16:45:02+00:00`` -> ``2026-11-29 16:45`` for a table cell."""
    if not iso:
        return ""
    return iso.replace("T", " ")[:16] if len(iso) >= 16 and iso[10] == "T" else iso


def parse_gpus(gpu: Mapping[str, Any]) -> tuple[list[Any], str | None]:
    """(GpuInfo list, error) from the probe's nvidia-smi output."""
    from rigfleet import gpu as gpu_parse

    if gpu.get("rc") != 0:
        why = (gpu.get("stderr") or gpu.get("stdout") or "").strip().splitlines()
        return [], f"nvidia-smi fails ({why[-1] if why else 'exit ' + str(gpu.get('rc'))})"
    try:
        return gpu_parse.parse_query_gpu(str(gpu.get("stdout", "")), GPU_FIELDS), None
    except gpu_parse.GpuParseError as e:
        return [], str(e)


def running_digest(container: Mapping[str, Any], repository: str) -> str | None:
    """The registry digest the container's image carries for ``repository`` (else any)."""
    digests = [str(d) for d in container.get("repo_digests") or []]
    for d in digests:
        repo, _, digest = d.partition("@")
        if repo == repository or repo.endswith("/" + repository):
            return digest
    return digests[0].partition("@")[2] if digests else None


def cap_drift(caps: Sequence[int], gpus: Sequence[Any]) -> list[str]:
    """``card N power limit X W, inventory Y W`` for each card whose limit is not its cap."""
    by_index = {g.index: g for g in gpus}
    out = []
    for i, want in enumerate(caps):
        g = by_index.get(i)
        have = getattr(g, "power_limit_w", None) if g is not None else None
        if g is None:
            out.append(f"card {i} missing (inventory cap {want} W)")
        elif have is None or abs(float(have) - want) > CAP_TOLERANCE_W:
            out.append(
                f"card {i} power limit {have:g} W, inventory {want} W"
                if have is not None
                else f"card {i} power limit unknown, inventory {want} W"
            )
    return out


def gate_summary(facts: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(result, time) of the last gate: ``state.json``'s ``gate``, else the newest report.

    The gate (``rigfleet.hostside.gate``) writes ``{"gate": {"result": "pass", "at": ...}}``
    into ``state.json``; ``passed``/``ok`` booleans and ``time``/``finished`` are read too.
    Without it, the newest ``reports/*.json`` is named with its time.
    """
    state = facts.get("state") if isinstance(facts.get("state"), dict) else {}
    for source in (
        state.get("gate"),
        state.get("last_gate"),
        (facts.get("last_report") or {}).get("data"),
    ):
        if isinstance(source, dict):
            result = _gate_result(source)
            when = source.get("time") or source.get("at") or source.get("finished")
            if result is not None or when is not None:
                return result, str(when) if when is not None else None
    report = facts.get("last_report")
    if isinstance(report, dict) and report.get("mtime"):
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(report["mtime"])))
        return "report " + Path(str(report.get("file"))).name, when
    return None, None


def _gate_result(source: Mapping[str, Any]) -> str | None:
    for key in ("result", "status", "verdict"):
        if isinstance(source.get(key), str):
            return str(source[key])
    for key in ("passed", "ok", "pass"):
        if isinstance(source.get(key), bool):
            return "pass" if source[key] else "fail"
    return None


def find_drift(exp: Expected, facts: Mapping[str, Any]) -> list[str]:
    """Everything on the host that differs from inventory + pins, one short line each.

    Pure: ``facts`` is the probe's JSON. Checks: power caps, the active stack's container
    (running, image digest), another stack running, Genesis HEAD, the weights manifest
    (revision, files unchanged), the front (answers with the key, refuses without), and
    ``state.json`` (records the active stack and its pins).

    **Example:**

    .. code:: python

        find_drift(exp, {"gpu": {...}, "containers": {...}, ...})
        # ['card 0 power limit 200 W, inventory 290 W']
    """
    drift: list[str] = []

    gpus, gpu_error = parse_gpus(facts.get("gpu") or {})
    if gpu_error:
        drift.append(gpu_error)
    else:
        drift += cap_drift(exp.power_caps_w, gpus)

    containers = facts.get("containers") or {}
    c = containers.get(exp.container)
    if c is None:
        drift.append(f"container {exp.container} does not exist")
    else:
        if c.get("status") != "running":
            drift.append(f"container {exp.container} is {c.get('status')}, not running")
        digest = running_digest(c, exp.repository)
        if digest != exp.digest:
            drift.append(
                f"{exp.container} runs {c.get('config_image') or c.get('image_id')} "
                f"(digest {_short(digest)}), pin is {_short(exp.digest)}"
            )
        have_hash = (c.get("labels") or {}).get(CONFIG_HASH_LABEL)
        if exp.config_hash and have_hash != exp.config_hash:
            drift.append(
                f"{exp.container} was started from another config (config-hash {have_hash}, "
                f"inventory + pins render {exp.config_hash})"
            )
    for other in exp.other_containers:
        if (containers.get(other) or {}).get("status") == "running":
            drift.append(f"container {other} is running too (only {exp.container} should)")

    if exp.genesis is not None:
        g = facts.get("genesis")
        head = g.get("head") if isinstance(g, dict) else None
        if head != exp.genesis.commit:
            drift.append(f"Genesis HEAD {_short(head)}, pin {_short(exp.genesis.commit)}")

    m = facts.get("manifest") or {}
    if m.get("error"):
        drift.append(f"weights manifest {m['error']}")
    else:
        if m.get("revision") != exp.model_revision or m.get("repo") != exp.model_repo:
            drift.append(
                f"manifest revision {_short(m.get('revision'))}, pin {_short(exp.model_revision)}"
            )
        if not m.get("intact"):
            drift.append(f"weights: {m.get('reason')}")

    route = facts.get("route")
    if route is not None and exp.config_hash and route != exp.route_id:
        drift.append(f"front routes to {route}, expected {exp.route_id}")

    front = facts.get("front") or {}
    if front.get("with_key") != 200:
        drift.append(
            f"front :{exp.front_port} answers {front.get('with_key')} with the key"
            + (f" ({front['error']})" if front.get("error") else "")
        )
    elif exp.served_model_name not in (front.get("models") or []):
        drift.append(f"front lists {front.get('models')}, not {exp.served_model_name}")
    if front.get("no_key") != 401:
        drift.append(f"front :{exp.front_port} answers {front.get('no_key')} without the key")

    state = facts.get("state")
    if not isinstance(state, dict):
        drift.append(f"state.json {facts.get('state_error') or 'unreadable'}")
    else:
        for key in ("stack", "digest", "genesis_commit", "model_revision"):
            if state.get(key) != exp.tracked.get(key):
                drift.append(
                    f"state.json {key} {_short(str(state.get(key)))}, "
                    f"expected {_short(str(exp.tracked.get(key)))}"
                )
    return drift


# --- rows ------------------------------------------------------------------------------------


@dataclass
class StatusRow:
    """One host's status (``--json`` prints these as objects)."""

    host: str
    reachable: bool
    stack: str | None = None
    digest: str | None = None
    genesis: str | None = None
    model_revision: str | None = None
    gate: str | None = None
    gate_time: str | None = None
    drift: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.reachable and not self.drift and self.error is None


def build_row(exp: Expected, facts: Mapping[str, Any], seconds: float = 0.0) -> StatusRow:
    """The row for a reachable host from the probe's facts (pure)."""
    state = facts.get("state") if isinstance(facts.get("state"), dict) else {}
    c = (facts.get("containers") or {}).get(exp.container) or {}
    running = next(
        (n for n, v in (facts.get("containers") or {}).items() if v.get("status") == "running"),
        None,
    )
    stack = state.get("stack") or (c.get("labels") or {}).get("io.rigfleet.stack")
    if stack is None and running:
        stack = running.removeprefix("rigfleet-")
    genesis = facts.get("genesis") if isinstance(facts.get("genesis"), dict) else {}
    result, when = gate_summary(facts)
    return StatusRow(
        host=exp.host,
        reachable=True,
        stack=stack,
        digest=running_digest(c, exp.repository) if c else None,
        genesis=genesis.get("head"),
        model_revision=(facts.get("manifest") or {}).get("revision"),
        gate=result,
        gate_time=when,
        drift=find_drift(exp, facts),
        seconds=round(seconds, 2),
    )


def host_status(
    host: InventoryHost, timeout: float = 20.0, pins_base: Path | None = None
) -> StatusRow:
    """Probe one host and decide its drift; never raises (problems land in the row)."""
    started = time.monotonic()
    try:
        exp = expected_state(host, pins_base)
    except RigfleetError as e:
        return StatusRow(host.name, reachable=False, error=f"inventory/pins: {e}")
    try:
        facts = run_probe(host, exp, timeout)
    except HostUnreachable as e:
        return StatusRow(
            host.name, reachable=False, error=str(e), seconds=round(time.monotonic() - started, 2)
        )
    return build_row(exp, facts, time.monotonic() - started)


def fleet_status(
    hosts: Sequence[InventoryHost],
    timeout: float = 20.0,
    pins_base: Path | None = None,
    probe: Callable[[InventoryHost], StatusRow] | None = None,
) -> list[StatusRow]:
    """Every host's row, probed concurrently, in inventory order.

    A host that does not answer within ``timeout`` (+ a margin for connecting) gets an
    unreachable row; the others are not held up by it.

    + hosts: from ``rigfleet.inventory.load_inventory``
    + timeout: seconds per host (connect, and the probe's answer)
    + probe: replaces ``host_status`` (tests)
    """
    check = probe or (lambda h: host_status(h, timeout, pins_base))
    if not hosts:
        return []
    pool = ThreadPoolExecutor(max_workers=min(32, len(hosts)), thread_name_prefix="status")
    futures = [pool.submit(check, h) for h in hosts]
    deadline = time.monotonic() + 2 * timeout + 5
    rows = []
    for h, fut in zip(hosts, futures, strict=True):
        try:
            rows.append(fut.result(timeout=max(0.1, deadline - time.monotonic())))
        except FutureTimeout:
            rows.append(StatusRow(h.name, reachable=False, error=f"no answer in {timeout:g}s"))
    # A hung connection must not hold the command: its thread is left to its socket timeout.
    pool.shutdown(wait=False, cancel_futures=True)
    return rows


def exit_status(rows: Sequence[StatusRow]) -> int:
    """0 all good, 1 some host drifted, 2 some host unreachable (or its data invalid)."""
    if any(not r.reachable or r.error for r in rows):
        return EXIT_UNREACHABLE
    if any(r.drift for r in rows):
        return EXIT_DRIFT
    return EXIT_OK


# --- rendering -------------------------------------------------------------------------------


def render_json(rows: Sequence[StatusRow]) -> str:
    """``--json``: ``{"hosts": [row, ...], "ok": bool}`` with full digests and commits."""
    return json.dumps(
        {"hosts": [{**asdict(r), "ok": r.ok} for r in rows], "ok": all(r.ok for r in rows)},
        indent=2,
    )


def render_table(rows: Sequence[StatusRow], title: str = "rigfleet status") -> Any:
    """A rich ``Table``: one row per host, drift lines in the last column."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    table.add_column("host", no_wrap=True)
    table.add_column("up", no_wrap=True)
    table.add_column("stack", no_wrap=True)
    for col in ("digest", "genesis", "model"):
        table.add_column(col, no_wrap=True)
    table.add_column("gate", overflow="fold")
    table.add_column("drift", overflow="fold", ratio=1)
    for r in rows:
        if not r.reachable:
            up = Text("no", style="red")
            drift = Text(r.error or "unreachable", style="red")
        else:
            up = Text("yes", style="green")
            drift = (
                Text("\n".join(r.drift), style="yellow") if r.drift else Text("none", style="green")
            )
        gate = "-" if r.gate is None else f"{r.gate} {_when(r.gate_time)}".strip()
        table.add_row(
            r.host,
            up,
            r.stack or "-",
            _hex(r.digest),
            _hex(r.genesis),
            _hex(r.model_revision),
            gate,
            drift,
        )
    return table


# --- command line ----------------------------------------------------------------------------


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``rigfleet status`` on the CLI's subparsers (``cli.py`` calls this)."""
    p = subparsers.add_parser(
        "status",
        help="one row per host: reachable, stack, pins, last gate, drift",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--inventory", default="inventory/home.py", help="pyinfra inventory file")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds per host (default 20)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """``rigfleet status``: print the fleet's rows; the exit status says the worst found."""
    import logging

    from rich.console import Console

    from rigfleet.inventory import InventoryError, load_inventory

    # paramiko logs a traceback for every refused connection; the row already says why.
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    logging.getLogger("paramiko").propagate = False
    try:
        hosts = load_inventory(args.inventory)
    except InventoryError as e:
        Console(stderr=True).print(f"[red]error:[/red] {e}")
        return EXIT_ERROR
    rows = fleet_status(hosts, timeout=args.timeout)
    if args.json:
        print(render_json(rows))
    else:
        Console().print(render_table(rows, f"rigfleet status ({args.inventory})"))
    return exit_status(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rigfleet.status --inventory ...``: the same command without ``cli.py``."""
    import sys

    parser = argparse.ArgumentParser(prog="rigfleet")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["status", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
