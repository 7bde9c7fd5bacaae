"""The one SSH layer outside pyinfra's own run (status, the bump, doctor, image streams),
on fabric, connecting as pyinfra's converge does (``rigfleet.sshconfig``, docs/operations.md):
host keys strict for every hop, ``sudo -n`` for ``_sudo`` hosts, a timeout on every call::

    rc, out = SshRemote().run(host, "docker image ls --digests")
    SshRemote().reachable(host)          # None when SSH works, else why not
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from rigfleet.errors import RigfleetError
from rigfleet.inventory import InventoryHost
from rigfleet.sshconfig import SshConfigError, SshTarget, resolve

# paramiko logs a traceback for every refused connection; the caller's message says why.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

CHUNK = 1 << 20


class HostUnreachable(RigfleetError):
    """SSH to the host failed (connection, host key, auth, timeout); the message says which."""


class Remote(Protocol):
    """What status and the bump need from a host (``SshRemote``; tests pass a fake)."""

    def run(self, host: InventoryHost, command: str, *, timeout: float = 120,
            stdin: bytes = b"") -> tuple[int, str]: ...

    def stream_out(self, host: InventoryHost, command: str, dest: BinaryIO, *,
                   timeout: float = 3600) -> tuple[int, str]: ...

    def stream_in(self, host: InventoryHost, command: str, src: BinaryIO, *,
                  timeout: float = 3600) -> tuple[int, str]: ...

    def reachable(self, host: InventoryHost) -> str | None: ...


def _client(target: SshTarget, data: dict[str, Any], timeout: float, gateway: Any = None) -> Any:
    """An unopened ``fabric.Connection`` to one hop, its host keys strict."""
    import paramiko
    from fabric import Config, Connection

    keys = target.key_files
    connect_kwargs: dict[str, Any] = {
        "allow_agent": bool(data.get("ssh_allow_agent", True)) if not keys else False,
        "look_for_keys": bool(data.get("ssh_look_for_keys", True)) if not keys else False,
        "banner_timeout": timeout,
        "auth_timeout": timeout,
    }
    given = {"key_filename": list(keys), "passphrase": data.get("ssh_key_password"),
             "password": data.get("ssh_password")}
    connect_kwargs.update((name, value) for name, value in given.items() if value)
    # rigfleet.sshconfig read the ssh_config; fabric must not read it again its own way.
    conn = Connection(target.hostname, user=target.user, port=target.port,
                      connect_timeout=max(1, int(target.connect_timeout or timeout)),
                      connect_kwargs=connect_kwargs, gateway=target.proxy_command or gateway,
                      config=Config(overrides={"load_ssh_configs": False}))
    try:
        if target.known_hosts:
            # The data's file must be there; a config's may not (OpenSSH: the host is unknown).
            named = data.get("ssh_known_hosts_file")
            for path in target.known_hosts:
                if named or Path(path).exists():
                    conn.client.load_host_keys(path)
        else:
            conn.client.load_system_host_keys()
    except OSError as e:
        raise HostUnreachable(f"cannot read known hosts {', '.join(target.known_hosts)}: "
                              f"{e.strerror}") from None
    strict = str(data.get("ssh_strict_host_key_checking", "yes")).lower()
    policy = (paramiko.AutoAddPolicy() if strict in ("no", "off", "false", "accept-new")
              else paramiko.RejectPolicy())
    conn.client.set_missing_host_key_policy(policy)
    return conn


def _close(conn: Any) -> None:
    """Close a connection and every ``ProxyJump`` hop under it."""
    while conn is not None and not isinstance(conn, str):
        conn.close()
        conn = getattr(conn, "gateway", None)


def prepare(host: InventoryHost, timeout: float) -> tuple[Any, SshTarget]:
    """``host``'s unopened connection (hops as gateways) and its target; ``HostUnreachable``."""
    try:
        target = resolve(host.name, host.data)
    except SshConfigError as e:
        raise HostUnreachable(str(e)) from None
    try:
        gateway = None
        for hop in target.jumps:
            gateway = _client(hop, host.data, timeout, gateway)
        return _client(target, host.data, timeout, gateway), target
    except HostUnreachable as e:
        raise HostUnreachable(f"{host.name}: {e}") from None


def connection(host: InventoryHost, timeout: float) -> Any:
    import paramiko

    conn, target = prepare(host, timeout)
    known = ", ".join(target.known_hosts) or "~/.ssh/known_hosts"
    where = f"ssh {target.where()}"
    try:
        conn.open()
        return conn
    except paramiko.BadHostKeyException as e:
        why = f"host key of {e.hostname} differs from {known} ({e})"
    except paramiko.SSHException as e:
        why = f"{where}: {e}"
        if "not found in known_hosts" in str(e):
            server = str(e).removeprefix("Server ").split(" not found")[0].strip("'")
            why = (f"{where}: {server} is not in {known} (strict host key checking); add it "
                   "(ssh-keyscan) or fix ssh_known_hosts_file")
    except (OSError, EOFError) as e:
        why = f"{where}: {getattr(e, 'strerror', None) or e}"
    _close(conn)
    raise HostUnreachable(f"{host.name}: {why}")


def _drain(recv: Callable[[int], bytes]) -> bytes:
    return b"".join(iter(partial(recv, 65536), b""))


class SshRemote:
    """``Remote`` over fabric; every call opens and closes its own connection."""

    def __init__(self, connect_timeout: float = 10.0) -> None:
        self.connect_timeout = connect_timeout

    @staticmethod
    def command(host: InventoryHost, command: str) -> str:
        """``command`` as it is sent (through ``sudo -n`` for ``_sudo`` hosts)."""
        return f"sudo -n sh -c {shlex.quote(command)}" if host.data.get("_sudo") else command

    @contextmanager
    def _channel(self, host: InventoryHost, command: str, timeout: float,
                 silent: str = "stream stalled for") -> Iterator[Any]:
        """A channel running ``command``; ``timeout`` s without data: ``HostUnreachable``."""
        conn = connection(host, self.connect_timeout)
        try:
            transport = conn.client.get_transport()
            assert transport is not None
            chan = transport.open_session(timeout=timeout)
            chan.settimeout(timeout)
            chan.exec_command(self.command(host, command))
            yield chan
        except TimeoutError:
            raise HostUnreachable(f"{host.name}: {silent} {timeout:g}s") from None
        except (OSError, EOFError) as e:  # the connection dropped mid-command (host stopped)
            raise HostUnreachable(f"{host.name}: connection lost: {e}") from None
        finally:
            _close(conn)

    def run(self, host: InventoryHost, command: str, *, timeout: float = 120,
            stdin: bytes = b"") -> tuple[int, str]:
        """(exit status, stdout then stderr) of ``command``; raises ``HostUnreachable``."""
        with self._channel(host, command, timeout, "no answer within") as chan:
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = _drain(chan.recv), _drain(chan.recv_stderr)
            rc = chan.recv_exit_status()
        text = out.decode(errors="replace")
        if err:
            text += ("" if not text or text.endswith("\n") else "\n") + err.decode(errors="replace")
        return rc, text

    def stream_out(self, host: InventoryHost, command: str, dest: BinaryIO, *,
                   timeout: float = 3600) -> tuple[int, str]:
        """Copy ``command``'s stdout into ``dest``; (exit status, stderr)."""
        with self._channel(host, command, timeout) as chan:
            chan.shutdown_write()
            while chunk := chan.recv(CHUNK):
                dest.write(chunk)
            err = _drain(chan.recv_stderr)  # small (docker's messages)
            return chan.recv_exit_status(), err.decode(errors="replace")

    def stream_in(self, host: InventoryHost, command: str, src: BinaryIO, *,
                  timeout: float = 3600) -> tuple[int, str]:
        """Feed ``src`` to ``command``'s stdin; (exit status, stdout then stderr)."""
        with self._channel(host, command, timeout) as chan:
            while chunk := src.read(CHUNK):
                chan.sendall(chunk)
            chan.shutdown_write()
            out = _drain(chan.recv) + _drain(chan.recv_stderr)
            return chan.recv_exit_status(), out.decode(errors="replace")

    def reachable(self, host: InventoryHost) -> str | None:
        """None when SSH works and runs a command, else the reason."""
        try:
            rc, out = self.run(host, "true", timeout=self.connect_timeout)
        except HostUnreachable as e:
            return str(e)
        return None if rc == 0 else f"`true` exited {rc}: {out.strip()[-200:]}"

