"""The roles' own operations: commands only when something would change (docs/operations.md)."""

from __future__ import annotations

import base64
import hashlib
import io
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, OperationError, StringCommand, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, systemd

from rigfleet.commands import apt as apt_commands
from rigfleet.factmemo import read_once
from rigfleet.facts import AptKeyring, DpkgState, FileDigest, FileInfo, read_fact

root_put = partial(files.put, user="root", group="root", mode="0644")
root_template = partial(files.template, user="root", group="root", mode="0644")
root_dir = partial(files.directory, user="root", group="root", mode="0755")
enabled_running = partial(systemd.service, running=True, enabled=True)  # a service, kept up


class DeployError(OperationError):
    """A check failed on a host; the message names the host and what is wrong."""


@dataclass(frozen=True, slots=True)
class Secret:
    """Text that must never be shown (pyinfra prints operation arguments): ``repr`` masks it."""

    _value: str

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)"  # str() too: object.__str__ is repr


def executing() -> bool:
    """True while pyinfra executes operations, False while it prepares (detects changes)."""
    return bool(host.state.is_executing)


def changed(gates: Sequence[OperationMeta]) -> bool:
    """Did (executing) or will (preparing) any of ``gates`` change something?"""
    if not executing():
        return any(g.will_change for g in gates)
    for gate in gates:
        try:
            if gate.did_change():
                return True
        except RuntimeError:  # not executed on this host: stay on the safe side
            return True
    return False


def connector_kwargs() -> dict[str, Any]:
    """The current operation's connector arguments (``_sudo`` and friends)."""
    current: dict[str, Any] = dict(host.current_op_global_arguments or {})
    return {k: v for k, v in current.items() if k in CONNECTOR_ARGUMENT_KEYS}


def run_on_host(command: str) -> tuple[bool, list[str], list[str]]:
    """Run a command now (at execution time): (ok, stdout lines, stderr lines)."""
    ok, output = host.run_shell_command(StringCommand(command), print_input=host.state.print_input,
                                        **connector_kwargs())
    return ok, output.stdout_lines, output.stderr_lines


def read_on_host(command: str) -> tuple[bool, list[str], list[str]]:
    """``run_on_host`` for a command that only reads: asked once while nothing changed."""
    args = tuple(sorted((k, repr(v)) for k, v in connector_kwargs().items()))
    return read_once(host, ("command", command, args), lambda: run_on_host(command))


def fail(message: str):
    """Yield a command that fails this host only (raising would stop every host)."""

    def _raise(state: Any, host: Any) -> None:
        raise DeployError(message)

    _raise.__name__ = "rigfleet_check_failed"
    yield FunctionCommand(_raise, (), {})


@operation(is_idempotent=False)
def on_change(commands: Sequence[Any], gates: Sequence[OperationMeta] = (),
              reason: str = "nothing it depends on changed", force: bool = False,
              window: Callable[[], Iterable[Any]] = tuple):
    """Run ``commands`` when ``force`` or any of ``gates`` changed, after what ``window()`` yields
    (``maintenance.enter``: a serving host's window); else ``--dry`` says ``reason``."""
    if force or changed(gates):
        yield from window()
        yield from commands
    else:
        host.noop(reason)


@operation()
def check(verify: Callable[[], str | None], what: str = "check"):
    """Run ``verify()`` at execution time only (never a change); a message fails the host."""
    if not executing():
        host.noop(f"{what}: checked when the deploy runs")
        return
    if problem := verify():
        yield from fail(f"{host.name}: {problem}")


@operation()
def apt_packages(packages: Sequence[str], hold: bool = False, version_prefix: str = "",
                 before: Callable[[Sequence[str]], Iterable[Any]] | None = None):
    """Install missing or off-pin packages (``name=version``; ``version_prefix``), held if ``hold``.
    ``before`` gets the update and download commands and yields what runs first, the update too."""
    dpkg = read_fact(DpkgState)
    install: list[str] = []
    replace = False
    names = [spec.partition("=")[0] for spec in packages]
    for spec in packages:
        name, _, version = spec.partition("=")
        if (pkg := dpkg.get(name)) is None or not pkg.installed:
            install.append(spec)
        elif (version and pkg.version != version) or not pkg.version.startswith(version_prefix):
            install.append(spec)
            replace = True
    if install:
        flags = {"allow_downgrades": replace or hold}
        inputs = [apt_commands.UPDATE, apt_commands.install(install, download_only=True, **flags)]
        yield from before(inputs) if before else inputs[:1]
        yield apt_commands.install(install, **flags)
    installing = {s.partition("=")[0] for s in install}
    unheld = [n for n in names if n in installing or not dpkg[n].held] if hold else []
    if unheld:
        yield apt_commands.hold(unheld)
    if not install and not unheld:
        host.noop(f"installed{' and held' if hold else ''}: {', '.join(names)}")


@operation()
def apt_keyring(key_url: str, dest: str, fingerprint: str | None = None):
    """Install the key at ``key_url`` dearmored as ``dest`` unless the same bytes are there."""
    if read_fact(AptKeyring, key_url=key_url, dest=dest) == "same":
        host.noop(f"{dest} matches {key_url}")
        return
    yield apt_commands.install_keyring(key_url, dest, fingerprint)


@operation()
def initial_file(dest: str, content: str):
    """Create ``dest`` (root-owned) only when missing: another program owns it afterwards."""
    if read_fact(FileDigest, path=dest) is not None:
        host.noop(f"{dest} exists (owned by the host from now on)")
        return
    yield f"install -m 0644 -o root -g root /dev/null {shlex.quote(dest)}"
    yield FileUploadCommand(io.BytesIO(content.encode()), dest)


def write_secret(dest: str, mode: str = "0600", user: str = "root", group: str = "root") -> str:
    """``secret_file``'s command: base64 on stdin into a file 0600 before any byte, renamed."""
    q = shlex.quote(dest)
    d = shlex.quote(dest.rsplit("/", 1)[0] or "/")
    return (f"umask 077 && rf_tmp=$(mktemp {d}/.rigfleet-secret.XXXXXXXX) && "
            f'{{ base64 -d > "$rf_tmp" && chown {shlex.quote(f"{user}:{group}")} "$rf_tmp" && '
            f'chmod {shlex.quote(mode)} "$rf_tmp" && mv -f "$rf_tmp" {q}; }} '
            f'|| {{ rm -f "${{rf_tmp:-}}"; exit 1; }}')


@operation()
def secret_file(dest: str, content: Secret, mode: str = "0600", user: str = "root",
                group: str = "root"):
    """Put a file whose content is a secret, never printed nor uploaded."""
    data = content.reveal().encode()
    current = read_fact(FileDigest, path=dest)
    if current is None or current.sha256 != hashlib.sha256(data).hexdigest():
        yield StringCommand(write_secret(dest, mode, user, group),
                            _stdin=base64.encodebytes(data).decode("ascii"))
    elif (current.mode, current.user, current.group) == (mode, user, group):
        host.noop(f"{dest} is up to date (content not shown)")
    else:
        if current.mode != mode:
            yield f"chmod {mode} {shlex.quote(dest)}"
        if (current.user, current.group) != (user, group):
            yield f"chown {user}:{group} {shlex.quote(dest)}"


@operation()
def checked_file(dest: str, content: str | Secret, check: str, mode: str = "0644",
                 group: str = "root"):
    """Put ``content`` at ``dest`` (root:``group``) once ``check`` (``{path}``: the staged copy,
    ``<dest>.rigfleet-new``) accepted it, else remove the copy; a ``Secret`` is staged as
    ``secret_file`` writes (an upload with ``_sudo`` passes through a file others can read)."""
    data = (content.reveal() if isinstance(content, Secret) else content).encode()
    if read_fact(FileDigest, path=dest) == FileInfo(mode, "root", group,
                                                   hashlib.sha256(data).hexdigest()):
        host.noop(f"{dest} is up to date")
        return
    tmp = f"{dest}.rigfleet-new"
    q = shlex.quote(tmp)
    if isinstance(content, Secret):
        yield StringCommand(write_secret(tmp, mode, "root", group),
                            _stdin=base64.encodebytes(data).decode("ascii"))
    else:
        yield f"install -m {mode} -o root -g {shlex.quote(group)} /dev/null {q}"
        yield FileUploadCommand(io.BytesIO(data), tmp)
        yield f"chown root:{shlex.quote(group)} {q} && chmod {mode} {q}"
    yield (f"{check.format(path=q)} || {{ rf_rc=$?; rm -f {q}; "
           f"echo {shlex.quote(f'rigfleet: {dest} not installed: the check refused it')} >&2; "
           "exit $rf_rc; }")
    yield f"mv -f {q} {shlex.quote(dest)}"


class WarnedCommand(StringCommand):
    """A shell command whose stderr lines starting with ``mark`` show as warnings."""

    def __init__(self, mark: str, command: str) -> None:
        super().__init__(command)
        self.mark = mark

    def execute(self, state: Any, host: Any, connector_arguments: Any) -> Any:
        status, output = super().execute(state, host, connector_arguments)
        for line in output.stderr_lines:
            if line.startswith(self.mark):
                host.log_styled(line.removeprefix(self.mark), fg="yellow",
                                log_func=logger.warning)
        return status, output
