"""apt command strings run in a shell with stand-in curl and gpg (no network, no apt)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rigfleet.commands.apt import keyring_state


def test_a_key_server_that_is_away_leaves_no_temporary_files(tmp_path: Path) -> None:
    """keyring_state runs as a fact at every converge: with the key server away it said
    ``same`` but left its two mktemp files behind each time."""
    bin_dir, tmp = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    tmp.mkdir()
    for name, body in (("curl", "exit 22"), ("gpg", "exit 0")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    dest = tmp_path / "key.gpg"
    dest.write_bytes(b"key")

    def state() -> str:
        out = subprocess.run(["sh", "-c", keyring_state("http://keys.example/k.asc", str(dest))],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                  "TMPDIR": str(tmp)})
        assert list(tmp.iterdir()) == []
        return out.stdout.strip()

    assert state() == "same"
    for served, said in (("key", "same"), ("new key", "differ")):  # the key server is back
        (bin_dir / "curl").write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && '
                                      f"printf '{served}' > \"$2\"; shift; done\n")
        assert state() == said
