"""An example fleet: two dual-RTX-3090 hosts on a home LAN.

Copy this file, change the addresses and the per-host values, and run::

    pyinfra inventory/home.py deploy.py            # the whole fleet
    pyinfra inventory/home.py deploy.py --limit canary

pyinfra turns every module-level list into a group (the file name adds a group too: ``home``).
Fleet defaults live in ``inventory/group_data/all.py``; a host's own data (the dicts below)
wins over them. ``rigfleet/hostdata.py`` checks every value before anything runs, and
docs/hostdata.md describes every key.
"""

gpu_hosts = [
    (
        "rig-a",
        {
            "ssh_hostname": "192.168.1.41",
            # Air-cooled cards: 290 W is club-3090's measured single-card sweet spot, and
            # dual-card decode is flat from 220 to 330 W per card.
            "power_caps_w": [290, 290],
            # The canary serves the Genesis stack first; the rest follow once it passes.
            "stack": "tq3-mtp-genesis",
            "model_dir": "/srv/models",
            "front_port": 8000,
        },
    ),
    (
        "rig-b",
        {
            "ssh_hostname": "192.168.1.42",
            # 250 W: on one X670E board a card fell off the bus at higher caps (club-3090).
            "power_caps_w": [250, 250],
            "stack": "int8",
            # Weights on the second NVMe of this box.
            "model_dir": "/data/models",
            "front_port": 8000,
        },
    ),
]

# Deployed first; `--limit canary`, then `--exclude canary` for the rest.
canary = ["rig-a"]
