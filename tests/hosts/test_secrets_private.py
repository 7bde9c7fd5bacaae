"""Secrets: root-only files and directory, unreadable by a non-root user, and the API key in no
file others can read (compose files, state, ledger, unit files, nginx config).

    pytest tests/hosts/test_secrets_private.py --inventory inventory/home.py
"""

from __future__ import annotations

import shlex

import pytest

from rigfleet.hostside.layout import HOST

SECRETS_DIR = str(HOST.secrets_dir)
VLLM_ENV_FILE = str(HOST.vllm_env_file)
# The front's key map (roles/front.py KEYS_PATH; the roles are not imported here).
NGINX_KEYS = "/etc/nginx/rigfleet-keys.conf"

# Where the deploy writes things (and so where a leaked key would land); the weights are left
# out (large, and the fetcher writes only hub files there). /etc/nginx holds HOST.front_dir.
SCANNED_DIRS = (
    *(str(d) for d in (HOST.etc_dir, HOST.opt_dir, HOST.state_dir, HOST.lib_dir)),
    "/etc/nginx", "/etc/docker", "/etc/systemd/system",
)  # fmt: skip


def secret_files(rig, listed: list[str]) -> list[str]:
    """The secrets the deploy writes, plus whatever else lies in the secrets directory."""
    files = [str(HOST.api_key_file), VLLM_ENV_FILE, str(HOST.auth_header_file), NGINX_KEYS]
    if rig.want.settings.hf_token_file:
        files.append(str(HOST.hf_token_file))
    return sorted({*files, *listed})


@pytest.fixture(scope="module")
def listed(sh) -> list[str]:
    return sh(
        f"find {shlex.quote(SECRETS_DIR)} -mindepth 1 -printf '%p\\n'", "list secrets"
    ).split()


def test_secrets_dir_root_only(host, rig, fail_if):
    d = host.file(SECRETS_DIR)
    problems = []
    if not d.is_directory:
        problems.append(f"{SECRETS_DIR} is missing")
    elif (d.user, d.group, d.mode) != ("root", "root", 0o700):
        problems.append(
            f"{SECRETS_DIR} is {d.user}:{d.group} {d.mode:04o}, expected root:root 0700"
        )
    fail_if("secrets directory", problems)


def test_secret_files_root_only(host, rig, listed, fail_if):
    problems = []
    for path in secret_files(rig, listed):
        f = host.file(path)
        if not f.exists:
            problems.append(f"{path} is missing")
        elif (f.user, f.group) != ("root", "root") or f.mode & 0o077:
            problems.append(f"{path} is {f.user}:{f.group} {f.mode:04o}, expected root:root 0600")
    fail_if("secret files readable beyond root", problems)


def test_non_root_user_cannot_read_secrets(host, rig, listed, fail_if):
    # Really try, as nobody: modes, ACLs and parent directories all count.
    probe = host.run("runuser -u nobody -- true")
    if probe.rc != 0:
        pytest.fail(
            f"{rig.name}: cannot run a command as user nobody to test reads "
            f"(`runuser -u nobody -- true` exited {probe.rc}: {probe.stderr.strip()})",
            pytrace=False,
        )
    problems = []
    for path in secret_files(rig, listed):
        read = host.run(f"runuser -u nobody -- head -c 1 {shlex.quote(path)}")
        if read.rc == 0:
            problems.append(f"user nobody can read {path}")
    fail_if("secrets readable by a non-root user", problems)


def test_no_readable_file_holds_the_api_key(host, rig, sh, require):
    # The pattern comes from the root-only env file into a root-only temp file, so the key is
    # never on a command line or sent over the connection.
    dirs = " ".join(shlex.quote(d) for d in SCANNED_DIRS)
    script = (
        "umask 077; t=$(mktemp) || exit 3; "
        f"sed -n 's/^VLLM_API_KEY=//p' {shlex.quote(VLLM_ENV_FILE)} > \"$t\"; "
        'if [ ! -s "$t" ]; then rm -f "$t"; echo NO-KEY; exit 0; fi; '
        f"find {dirs} -xdev -type f -perm -o=r -size -20M -print0 2>/dev/null "
        '| xargs -0 -r grep -lF -f "$t" 2>/dev/null; rm -f "$t"; true'
    )
    out = sh(script, "scan for the API key").split()
    require(out != ["NO-KEY"], f"{rig.name}: {VLLM_ENV_FILE} holds no VLLM_API_KEY")
    require(not out, f"{rig.name}: files readable by any user hold the API key: {out}")


def test_docker_group_has_no_members(host, rig, require):
    # Members of the docker group can `docker inspect` the serving container and read
    # VLLM_API_KEY from its environment: they are root in all but name.
    entry = host.run("getent group docker").stdout.strip()
    members = [m for m in entry.split(":")[3].split(",") if m] if entry.count(":") >= 3 else []
    require(
        not members,
        f"{rig.name}: users {members} are in group docker and can read the API key with "
        "`docker inspect`; remove them (gpasswd -d USER docker) or accept that they are root",
    )
