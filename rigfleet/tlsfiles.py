"""TLS files of host data (``front_tls_*``, ``balancer_tls_*``) checked on the control machine,
never showing the key; ``local_text`` reads every file host data names on this machine.
"""

from __future__ import annotations

import os
import re
import ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigfleet.hostside.verify.client import tls_context
from rigfleet.validate import Problems


@dataclass(frozen=True)
class FrontTls:
    """The certificate and key a front or balancer serves, and the CA its clients trust."""

    cert_file: str
    key_file: str
    ca_file: str


def check_tls(p: Problems, values: Mapping[str, Any], prefix: str,
              url_key: str) -> FrontTls | None:
    """``<prefix>_tls_*_file`` of a ``front`` (nginx) or ``balancer`` (HAProxy), a plain-HTTP
    ``url_key`` beside them refused; None when neither is set or a problem is in ``p``."""
    cert_key, key_key, ca_key = (f"{prefix}_tls_{k}_file" for k in ("cert", "key", "ca"))
    cert, key, ca = values[cert_key], values[key_key], values[ca_key]
    if cert is None and key is None:
        if ca is not None:
            p.bad(ca_key, ca, f"only together with {cert_key} and {key_key}",
                  f"is set but the {prefix} has no certificate")
        return None
    if cert is None or key is None:
        p.missing(key_key if key is None else cert_key, f"both {cert_key} and {key_key} (PEM "
                  f"files on this machine), or neither (the {prefix} serves plain HTTP)")
        return None
    cert_path = cert_file(p, cert_key, cert)
    key_path = _key_file(p, key_key, key)
    ca_path = cert_path if ca is None else cert_file(p, ca_key, ca)
    if not (cert_path and key_path and ca_path):
        return None
    if problem := tls_pair_problem(cert_path, key_path, ca_path, cert_key):
        which, what, allowed = problem
        if which == "key":
            p.bad(key_key, key, allowed, what)
        elif ca is not None:
            p.bad(ca_key, ca, allowed, what)
        else:
            p.bad(cert_key, cert, allowed + f" (set {ca_key} to the CA when the "
                  "certificate is not self-signed)", what)
        return None
    if (url := values[url_key]) and url.startswith("http://"):
        p.bad(url_key, url, f"an https:// URL (or no {url_key})",
              f"is plain HTTP, but the {prefix} serves TLS ({cert_key} is set)")
    return FrontTls(cert_path, key_path, ca_path)


def local_text(p: Problems, key: str, value: Any, allowed: str,
               private_why: str | None = None) -> tuple[Path, str] | None:
    """A regular UTF-8 file on this (control) machine, with ``private_why`` the owner's alone
    (why): (absolute path, text), or None with the problem in ``p``."""
    if not isinstance(value, str) or not value.strip():
        p.bad(key, value, allowed)
        return None
    path = Path(os.path.expanduser(value)).absolute()
    try:
        if not stat.S_ISREG(mode := path.stat().st_mode):  # a FIFO would block the read
            p.bad(key, value, allowed, "is not a regular file")
        elif private_why is None or private(p, key, value, path, mode, private_why):
            return path, path.read_text(encoding="utf-8")
    except FileNotFoundError:
        p.bad(key, value, allowed, "does not exist")
    except (OSError, UnicodeDecodeError) as e:
        p.bad(key, value, allowed, f"cannot be read ({getattr(e, 'strerror', None) or e})")
    return None


def cert_file(p: Problems, key: str, value: Any) -> str | None:
    """A PEM certificate file on this machine (``*_tls_cert_file``, ``site_ca_files``)."""
    allowed = "a readable PEM file on this (control) machine holding '-----BEGIN CERTIFICATE'"
    if (found := local_text(p, key, value, allowed)) is None:
        return None
    path, text = found
    if "-----BEGIN CERTIFICATE-----" not in text:
        p.bad(key, value, allowed, "is not a PEM certificate")
        return None
    return str(path)


def _key_file(p: Problems, key: str, value: Any) -> str | None:
    allowed = "a PEM private key on this (control) machine, mode 0600, unencrypted"
    # The content is a secret: describe it, never show it.
    if (found := local_text(p, key, value, allowed, "")) is None:
        return None
    path, text = found
    if "ENCRYPTED" in text:
        p.bad(key, value, f"{allowed} (nginx cannot ask for a passphrase at boot; "
              f"decrypt it: openssl pkey -in {path} -out <new file>)", "is an encrypted key")
        return None
    if not re.search(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----", text):
        p.bad(key, value, allowed, "holds no PEM private key (content not shown)")
        return None
    return str(path)


def private(p: Problems, key: str, value: Any, path: Path, mode: int, why: str = "") -> bool:
    """No one but the owner may read ``path`` (``mode``: its ``st_mode``)."""
    if mode & 0o077:
        p.bad(key, value, f"mode 0600 or stricter{why}: chmod 600 {path}",
              f"is readable by others (mode {stat.S_IMODE(mode):04o})")
    return not mode & 0o077


def tls_pair_problem(cert: str, key: str, ca: str, cert_key: str) -> tuple[str, str, str] | None:
    """Does ``key`` belong to ``cert`` and ``cert`` verify against ``ca`` (dates included)? An
    in-memory handshake tells: (which: "key" | "verify", what, allowed) or None; no key shown."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        server.load_cert_chain(cert, key, password="")  # never a prompt on the terminal
    except (ssl.SSLError, ValueError, OSError) as e:
        reason = getattr(e, "reason", None) or type(e).__name__
        return ("key", f"does not load with the certificate ({reason}: the key is not the "
                "certificate's, or not a key nginx can use)",
                f"the private key that belongs to {cert_key}")
    try:
        client = tls_context(ca)
    except (ssl.SSLError, OSError) as e:
        return ("verify", f"cannot be loaded as trusted certificates ({e})",
                f"PEM certificate(s) of the CA that signed {cert_key}")
    client.check_hostname = False
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    waiting = {"client": client.wrap_bio(c_in, c_out),
               "server": server.wrap_bio(s_in, s_out, server_side=True)}
    for _ in range(20):
        for name, side in list(waiting.items()):
            try:
                side.do_handshake()
                del waiting[name]
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as e:
                ca_key = cert_key.replace("_cert_", "_ca_")
                who = cert_key.partition("_tls_")[0]
                return ("verify", f"does not verify the {who}'s certificate "
                        f"({e.verify_message})",
                        f"the CA that signed {cert_key} ({ca_key}), or a "
                        "certificate that is valid now")
            except ssl.SSLError as e:
                if name == "server":
                    break  # the client's error says why
                return ("verify", f"fails a TLS handshake ({e.reason or e})",
                        "a certificate and key nginx can serve")
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if not waiting:
            return None
    return ("verify", "fails a TLS handshake (no result)", "a certificate and key nginx can serve")
