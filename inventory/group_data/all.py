"""Fleet defaults: every host gets these unless its own data says otherwise.

pyinfra loads this file as the data of group ``all`` (module-level names; imports and names
starting with ``__`` are left out). ``rigfleet/hostdata.py`` validates the merged result per
host; docs/hostdata.md describes every key.
"""

# The SSH login (pyinfra's ssh_user; without it pyinfra logs in as your local user, while
# rigfleet's own commands log in as root): root, or a user with passwordless sudo and
# `_sudo = True` in the host's data.
ssh_user = "root"

# The stack a host serves unless its own data names another (rigfleet/catalog.py).
stack = "int8"

# One cap for every card, in watts; hosts usually set a list, one per card. Checked against
# each card's real min..max at deploy time. 250 W is club-3090's conservative dual-card cap.
power_caps_w = 250

# GPUs each host must have (both stacks are tensor-parallel over 2 cards).
gpu_count = 2

# Weights go to <model_dir>/<pins model.local_dir>, mounted read-only into the container.
model_dir = "/srv/models"

# The authenticating front proxy listens here; the stacks only listen on loopback.
front_port = 8000

# Relative to where pyinfra runs (the repository root).
pins_file = "pins.yaml"

# On this (control) machine, mode 0600, one line. Create it with:
#   umask 077; mkdir -p ~/.config/rigfleet; openssl rand -hex 32 > ~/.config/rigfleet/api-key
api_key_file = "~/.config/rigfleet/api-key"

# Optional: a Hugging Face token for downloads (public weights need none; a token avoids
# rate limits). Same rules as api_key_file.
# hf_token_file = "~/.config/rigfleet/hf-token"

# Optional mirrors for hosts without (fast) internet:
# docker_registry_mirror = "http://registry.lan:5000"   # Docker Hub pull-through cache
# pip_index_url = "http://pypi.lan/simple"              # the Genesis entrypoint pip-installs
# hf_endpoint = "http://hf-mirror.lan"                  # HF_ENDPOINT for the model download

# Extra container environment per stack (debugging, test fault injection), e.g.
# extra_env = {"int8": {"VLLM_LOGGING_LEVEL": "DEBUG"}}
extra_env = {}

# Check host keys; add hosts to ~/.ssh/known_hosts (ssh-keyscan) before the first run.
ssh_strict_host_key_checking = "yes"

# Apt repositories for the NVIDIA driver, the container toolkit and Docker. Placeholders are
# filled per host from /etc/os-release: {id} (ubuntu, debian), {version} (24.04, 12),
# {codename} (noble, bookworm), {distro} (NVIDIA's name: ubuntu2404, debian12). `$(ARCH)` is
# apt's own variable. A suite ending in "/" is a flat repository (no components). An entry's
# per_distro gives the keys that differ for hosts of one NVIDIA distribution ({distro}).
apt_repos = {
    # NVIDIA's CUDA network repository, one per distribution ({distro}), flat ("/"). Used on
    # Debian, whose own driver packages stop at 535/550 (CUDA 13 vLLM images need >= 580);
    # Ubuntu takes the driver from its own archive. NVIDIA does not rotate the keys of
    # existing repositories: debian12, ubuntu2204 and ubuntu2404 stay signed with 3bf863cc,
    # whose SHA-1 binding their apt (gpgv) accepts. debian13 is signed with a new key,
    # 8793F200 (NVIDIA/cuda-repo-management#30, #34, #39): Debian 13's apt verifies with sqv,
    # which rejects SHA-1 bindings since 2026-02-01, so the debian12 repository fails there
    # unless the host's crypto policy is relaxed (rigfleet never relaxes it). The debian13
    # repository carries no 580 driver (#38, #40): pins.yaml's driver branch is one every
    # repository carries (docs/converge.md, "NVIDIA driver").
    "cuda": {
        "url": "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/",
        "key_url": (
            "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/3bf863cc.pub"
        ),
        "suite": "/",
        "components": [],
        "key_fingerprint": "EB693B3035CD5710E231E123A4B469963BF863CC",
        "per_distro": {
            "debian13": {
                "key_url": (
                    "https://developer.download.nvidia.com/compute/cuda/repos/debian13/x86_64/"
                    "8793F200.pub"
                ),
                # As pinned by third-party installers checking that key file (not confirmed
                # on an NVIDIA page): a wrong one stops the deploy before apt trusts the key.
                "key_fingerprint": "02182E60104FCDC26EAE1B8597A5D4CB8793F200",
            },
        },
    },
    # NVIDIA Container Toolkit ("should work for any Debian-derived distribution").
    "nvidia-container-toolkit": {
        "url": "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)",
        "key_url": "https://nvidia.github.io/libnvidia-container/gpgkey",
        "suite": "/",
        "components": [],
        "key_fingerprint": "C95B321B61E88C1809C4F759DDCAE044F796ECB0",
    },
    # Docker's own repository, for Compose v2 (Debian 12 ships only Compose v1).
    "docker": {
        "url": "https://download.docker.com/linux/{id}",
        "key_url": "https://download.docker.com/linux/{id}/gpg",
        "suite": "{codename}",
        "components": ["stable"],
        "key_fingerprint": "9DC858229FC7DD38854AE2D88D81803C0EBFCD88",
    },
}
