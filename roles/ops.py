"""Custom operations shared by the roles.

Why custom rather than pyinfra's own: ``--dry`` must tell the truth. On a converged host the
plan has to be empty, so every operation here yields commands only when something would change:

- ``apt_packages`` installs (after one ``apt-get update``) only what is missing or on the wrong
  version, and holds only what is not held; ``apt.packages(update=True)`` would "change" on
  every run.
- ``on_change`` runs commands when one of the given operations changed. pyinfra's ``_if`` would
  list the command under "Conditional Change" on every ``--dry``; ``on_change`` asks the gates'
  ``will_change`` while preparing and their ``did_change()`` while executing.
- ``check`` runs a verification at execution time only, and fails the host with a message
  (instead of ``python.call``, which always counts as a change).
- ``secret_file`` writes a root-only file without ever printing its content (``files.put``
  prints a diff with ``--diff``) and without an upload: pyinfra stages a sudo user's upload
  in /tmp with that user's umask, readable by others for a moment.
- ``initial_file`` seeds a file that the host owns afterwards (the front's route).
- ``checked_file`` installs a config only once its program accepted it (``haproxy -c``): a
  staged copy is checked, then moved into place, so a refused config never replaces a good
  one (``files.template`` would install first).

Example::

    from roles.ops import apt_packages, on_change

    daemon = merge_daemon_json(...)
    on_change(name="Restart Docker", commands=["systemctl restart docker"], gates=[daemon])
"""

from __future__ import annotations

import base64
import hashlib
import io
import shlex
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pyinfra import host, logger
from pyinfra.api import (
    FileUploadCommand,
    FunctionCommand,
    OperationError,
    StringCommand,
    operation,
)
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.operation import OperationMeta

from rigfleet.commands import apt as apt_commands
from rigfleet.factmemo import read_once
from rigfleet.facts import AptKeyring, DpkgState, FileDigest, read_fact


class DeployError(OperationError):
    """A check failed on a host; the message names the host and what is wrong."""


class Secret:
    """Text that must never be shown: its ``repr``/``str`` are masked.

    pyinfra prints operation arguments in plans and logs; wrapping a secret keeps it out.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself (only for building the file content)."""
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__


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
        except RuntimeError:
            # Not executed on this host (cannot happen in order; stay on the safe side).
            return True
    return False


def connector_kwargs() -> dict[str, Any]:
    """The current operation's connector arguments (``_sudo`` and friends), for commands and
    file copies an operation runs itself."""
    current: dict[str, Any] = dict(host.current_op_global_arguments or {})
    return {k: v for k, v in current.items() if k in CONNECTOR_ARGUMENT_KEYS}


def run_on_host(command: str) -> tuple[bool, list[str], list[str]]:
    """Run a command now (inside an operation, at execution time).

    The current operation's connector arguments (``_sudo`` and friends) apply, as they do to
    facts; ``-vv`` prints it as it prints an operation's commands. Returns (ok, stdout lines,
    stderr lines).
    """
    ok, output = host.run_shell_command(StringCommand(command), print_input=host.state.print_input,
                                        **connector_kwargs())
    return ok, output.stdout_lines, output.stderr_lines


def read_on_host(command: str) -> tuple[bool, list[str], list[str]]:
    """``run_on_host`` for a command that only reads: asked once per run while nothing
    changed on the host, as facts are (``rigfleet.facts.read_once``)."""
    args = tuple(sorted((k, repr(v)) for k, v in connector_kwargs().items()))
    return read_once(host, ("command", command, args), lambda: run_on_host(command))


def fail(message: str):
    """Yield a command that fails the host with ``message`` (use as ``yield from fail(..)``).

    Raising inside an operation's generator at execution time would abort the whole run for
    every host; a failing ``FunctionCommand`` fails only this host, with the message shown.
    """

    def _raise(state: Any, host: Any) -> None:
        raise DeployError(message)

    _raise.__name__ = "rigfleet_check_failed"
    yield FunctionCommand(_raise, (), {})


@operation(is_idempotent=False)
def on_change(
    commands: Sequence[str],
    gates: Sequence[OperationMeta],
    reason: str = "nothing it depends on changed",
):
    """Run ``commands`` when any of ``gates`` changed.

    + commands: shell commands, in order
    + gates: operations whose change triggers the commands
    + reason: what ``--dry`` says when nothing runs

    **Example:**

    .. code:: python

        on_change(name="Reload nginx", commands=["systemctl reload nginx"], gates=[conf])
    """
    if changed(gates):
        yield from commands
    else:
        host.noop(reason)


@operation()
def check(verify: Callable[[], str | None], what: str = "check"):
    """Run ``verify()`` at execution time; a returned message fails the host.

    While preparing nothing is checked (the state the check is about does not exist yet on a
    bare host), so a check never shows up as a change.

    + verify: returns None when all is well, else the failure message
    + what: a short description for ``--dry``
    """
    if not executing():
        host.noop(f"{what}: checked when the deploy runs")
        return
    problem = verify()
    if problem:
        yield from fail(f"{host.name}: {problem}")


@operation()
def apt_packages(
    packages: Sequence[str],
    hold: bool = False,
    version_prefix: str | None = None,
    before: Callable[[Sequence[str]], Iterable[Any]] | None = None,
):
    """Install missing packages (after ``apt-get update``), optionally ``apt-mark hold`` them.

    + packages: ``name`` or ``name=version`` (exact version)
    + hold: hold every listed package (unattended upgrades leave them alone)
    + version_prefix: installed versions must start with this (a driver branch, ``"580."``);
      apt preferences make apt pick the right one, this op notices a wrong one
    + before: only when something is installed: called with the commands that bring the
      packages onto the host (``apt-get update``, ``install --download-only``), it yields the
      commands to run first, those included (the maintenance window of a step that disturbs
      a serving host opens after the download: ``roles.maintenance.enter``); when it yields
      nothing (a bare host), ``apt-get update`` runs as usual

    **Example:**

    .. code:: python

        apt_packages(name="Toolkit", packages=["nvidia-container-toolkit=1.17.8-1"], hold=True)
    """
    dpkg = read_fact(DpkgState)
    install: list[str] = []
    unheld: list[str] = []
    replace = False
    names: list[str] = []
    for spec in packages:
        name, _, version = spec.partition("=")
        names.append(name)
        pkg = dpkg.get(name)
        if pkg is None or not pkg.installed:
            install.append(spec)
        elif (version and pkg.version != version) or (
            version_prefix and not pkg.version.startswith(version_prefix)
        ):
            install.append(spec)
            replace = True
    if install:
        flags = {"allow_downgrades": replace or hold}
        fetched = False
        if before is not None:
            for command in before([apt_commands.update(),
                                   apt_commands.install(install, download_only=True, **flags)]):
                fetched = True
                yield command
        if not fetched:
            yield apt_commands.update()
        yield apt_commands.install(install, **flags)
    if hold:
        installing = {s.partition("=")[0] for s in install}
        unheld = [n for n in names if n in installing or not dpkg[n].held]
        if unheld:
            yield apt_commands.hold(unheld)
    if not install and not unheld:
        host.noop(f"installed{' and held' if hold else ''}: {', '.join(names)}")


@operation()
def apt_keyring(key_url: str, dest: str, fingerprint: str | None = None):
    """Install a repository signing key as ``dest`` (curl + ``gpg --dearmor``), idempotently.

    The installed keyring is compared byte for byte with the dearmored key at ``key_url``, so
    a rotated key is noticed.

    + key_url: the (armored) key's URL
    + dest: ``/etc/apt/keyrings/<name>.gpg``
    + fingerprint: optional 40-hex fingerprint the key must have
    """
    state = read_fact(AptKeyring, key_url=key_url, dest=dest)
    if state == "same":
        host.noop(f"{dest} matches {key_url}")
        return
    yield apt_commands.install_keyring(key_url, dest, fingerprint)


@operation()
def initial_file(dest: str, content: str, mode: str = "0644"):
    """Create ``dest`` with ``content`` only when it does not exist; never change it after.

    For files another program owns once they exist (the front's route, switched by the
    host-side swap tool): the deploy seeds them, and a converged host shows no change.

    + dest: absolute path (its directory must exist)
    + content: the first content
    + mode: its mode (root owns it)
    """
    if read_fact(FileDigest, path=dest) is not None:
        host.noop(f"{dest} exists (owned by the host from now on)")
        return
    q = shlex.quote(dest)
    yield f"install -m {mode} -o root -g root /dev/null {q}"
    yield FileUploadCommand(io.BytesIO(content.encode()), dest)


def write_secret(dest: str, mode: str = "0600", user: str = "root", group: str = "root") -> str:
    """The shell command ``secret_file`` runs: base64 on stdin into a new root-only file.

    ``mktemp`` creates the file in ``dest``'s directory, mode 0600 and owned by the user the
    command runs as (root, directly or through sudo), before any byte is written; the
    decoded bytes go into it, then owner and mode are set and it is renamed over ``dest``
    (atomic: readers see the old file or the new one). Nothing of the secret is in the
    command line; nothing passes through /tmp.
    """
    q = shlex.quote(dest)
    d = shlex.quote(dest.rsplit("/", 1)[0] or "/")
    owner = shlex.quote(f"{user}:{group}")
    return (
        f"umask 077 && rf_tmp=$(mktemp {d}/.rigfleet-secret.XXXXXXXX) && "
        f'{{ base64 -d > "$rf_tmp" && chown {owner} "$rf_tmp" && '
        f'chmod {shlex.quote(mode)} "$rf_tmp" && mv -f "$rf_tmp" {q}; }} '
        f'|| {{ rm -f "${{rf_tmp:-}}"; exit 1; }}'
    )


@operation()
def secret_file(
    dest: str,
    content: Secret,
    mode: str = "0600",
    user: str = "root",
    group: str = "root",
):
    """Put a root-only file whose content is a secret; the content is never printed.

    The content travels base64-encoded on the stdin of one command (``write_secret``) over
    the SSH channel, never as an SFTP upload (pyinfra stages a sudo user's uploads in /tmp
    with that user's umask) and never in a command line (``ps``); sudo asks for a password
    through its askpass helper, so stdin is the command's. The file is created 0600 before
    any byte is written and renamed into place. Same path for root and for a sudo user.

    + dest: absolute path (its directory must exist)
    + content: the text, wrapped in ``Secret``
    + mode, user, group: wanted permissions
    """
    data = content.reveal().encode()
    wanted = hashlib.sha256(data).hexdigest()
    current = read_fact(FileDigest, path=dest)
    q = shlex.quote(dest)
    if current is None or current.sha256 != wanted:
        yield StringCommand(write_secret(dest, mode, user, group),
                            _stdin=base64.encodebytes(data).decode("ascii"))
        return
    if current.mode != mode:
        yield f"chmod {mode} {q}"
    if (current.user, current.group) != (user, group):
        yield f"chown {user}:{group} {q}"
    if current.mode == mode and (current.user, current.group) == (user, group):
        host.noop(f"{dest} is up to date (content not shown)")


@operation()
def checked_file(dest: str, content: str, check: str, staged: str | None = None,
                 mode: str = "0644"):
    """Put ``content`` at ``dest`` (root-owned) only after ``check`` accepted a staged copy.

    The copy goes to ``staged`` (default ``<dest>.rigfleet-new``, same directory), ``check``
    runs on it (``{path}`` in it is replaced by the quoted staged path), and only when it
    passes is the copy renamed over ``dest`` (atomic); when it fails the copy is removed, the
    host fails with the program's message and ``dest`` is untouched. Not for secrets (the copy
    is an upload).

    + dest: absolute path of the config
    + content: the wanted text
    + check: the validating command, e.g. ``haproxy -c -q -f {path}``
    + staged: where the copy is checked
    + mode: the config's mode
    """
    data = content.encode()
    current = read_fact(FileDigest, path=dest)
    if (current is not None and current.sha256 == hashlib.sha256(data).hexdigest()
            and current.mode == mode and (current.user, current.group) == ("root", "root")):
        host.noop(f"{dest} is up to date")
        return
    tmp = staged or f"{dest}.rigfleet-new"
    q = shlex.quote(tmp)
    yield f"install -m {mode} -o root -g root /dev/null {q}"
    yield FileUploadCommand(io.BytesIO(data), tmp)
    yield f"chown root:root {q} && chmod {mode} {q}"
    yield (f"{check.format(path=q)} || {{ rf_rc=$?; rm -f {q}; "
           f"echo {shlex.quote(f'rigfleet: {dest} not installed: the check refused it')} >&2; "
           "exit $rf_rc; }")
    yield f"mv -f {q} {shlex.quote(dest)}"


class WarnedCommand(StringCommand):
    """A shell command whose stderr lines starting with ``mark`` pyinfra shows as this host's
    warnings even when the command succeeds (it prints a command's output only on failure).

    + mark: e.g. ``[rigfleet-weights] WARNING: `` (shown without it)
    """

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
