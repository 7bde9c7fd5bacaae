"""One command on a host over SSH, as the inventory says to reach it.

The connection is ``rigfleet.status.ssh_client``: paramiko with the inventory's SSH data and
strict host keys from ``ssh_known_hosts_file``. Hosts whose data sets ``_sudo`` get the
command through ``sudo -n`` (the bump reads root-only state and runs docker)::

    remote = SshRemote()
    rc, out = remote.run(host, "docker image ls --digests")
    remote.reachable(host)          # None when SSH works, else why not
    with open("img.tar", "wb") as f:
        remote.stream(host, "docker save vllm/vllm-openai:nightly-...", f)
"""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Protocol

from rigfleet.inventory import InventoryHost
from rigfleet.status import HostUnreachable, ssh_client

__all__ = ["HostUnreachable", "Remote", "SshRemote", "reachability"]


class Remote(Protocol):
    """What the bump needs from a host (``SshRemote``; tests pass a fake)."""

    def run(
        self, host: InventoryHost, command: str, *, timeout: float = 120, stdin: bytes = b""
    ) -> tuple[int, str]: ...

    def stream(
        self, host: InventoryHost, command: str, dest: BinaryIO, *, timeout: float = 3600
    ) -> tuple[int, str]: ...

    def reachable(self, host: InventoryHost) -> str | None: ...


class SshRemote:
    """``Remote`` over paramiko; every call opens and closes its own connection."""

    def __init__(self, connect_timeout: float = 10.0) -> None:
        self.connect_timeout = connect_timeout

    def _command(self, host: InventoryHost, command: str) -> str:
        if host.data.get("_sudo"):
            return f"sudo -n sh -c {shlex.quote(command)}"
        return command

    def run(
        self, host: InventoryHost, command: str, *, timeout: float = 120, stdin: bytes = b""
    ) -> tuple[int, str]:
        """(exit status, stdout+stderr) of ``command``; raises ``HostUnreachable``."""
        client = ssh_client(host, self.connect_timeout)
        try:
            chan = _session(client, timeout)
            chan.set_combine_stderr(True)
            chan.exec_command(self._command(host, command))
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out = bytearray()
            try:
                while chunk := chan.recv(65536):
                    out += chunk
            except TimeoutError:
                raise HostUnreachable(f"{host.name}: no answer within {timeout:g}s") from None
            return chan.recv_exit_status(), out.decode(errors="replace")
        except OSError as e:  # the connection dropped mid-command (host stopped)
            raise HostUnreachable(f"{host.name}: connection lost: {e}") from None
        finally:
            client.close()

    def stream(
        self, host: InventoryHost, command: str, dest: BinaryIO, *, timeout: float = 3600
    ) -> tuple[int, str]:
        """Copy ``command``'s stdout into ``dest``; (exit status, stderr)."""
        client = ssh_client(host, self.connect_timeout)
        try:
            chan = _session(client, timeout)
            chan.exec_command(self._command(host, command))
            chan.shutdown_write()
            try:
                while chunk := chan.recv(1 << 20):
                    dest.write(chunk)
            except TimeoutError:
                raise HostUnreachable(f"{host.name}: stream stalled for {timeout:g}s") from None
            err = b""  # small (docker's messages); read after stdout ends
            while part := chan.recv_stderr(65536):
                err += part
            return chan.recv_exit_status(), err.decode(errors="replace")
        except OSError as e:
            raise HostUnreachable(f"{host.name}: connection lost: {e}") from None
        finally:
            client.close()

    def reachable(self, host: InventoryHost) -> str | None:
        """None when SSH works and runs a command, else the reason."""
        try:
            rc, out = self.run(host, "true", timeout=self.connect_timeout)
        except HostUnreachable as e:
            return str(e)
        return None if rc == 0 else f"`true` exited {rc}: {out.strip()[-200:]}"


def _session(client, timeout: float):  # noqa: ANN001, ANN202 - paramiko types
    transport = client.get_transport()
    assert transport is not None
    chan = transport.open_session(timeout=timeout)
    chan.settimeout(timeout)
    return chan


def reachability(remote: Remote, hosts: list[InventoryHost]) -> dict[str, str | None]:
    """host name -> None (reachable) or the reason, all hosts checked at once."""
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        answers = list(pool.map(remote.reachable, hosts))
    return {h.name: a for h, a in zip(hosts, answers, strict=True)}
