"""``rigfleet bump``: move the fleet to a newer vLLM image (and Genesis commit), safely.

One command finds the candidate, checks it against Genesis, rolls it out canary-first through
the deploy's own swap transaction (stop old, start new, verify-stress gate, promote or roll
back), and writes the pins file only for what actually promoted::

    rigfleet bump --inventory inventory/home.py --latest --dry
    rigfleet bump --inventory inventory/home.py --image nightly-<40-hex> --batch-size 2 --yes

See docs/bump.md for the whole sequence, the pins file's ``hosts:`` section and exit statuses.

Modules (control side; nothing here runs on a host except through SSH or pyinfra):

- ``candidate``  registry v2: the candidate tag, its digest and build time (``--latest``)
- ``version``    the candidate's ``vllm.__version__``, read from the image on the canary
- ``genesis``    KNOWN_GOOD_VLLM_PINS at the pinned and newer Genesis commits (a git cache)
- ``plan``       pure: hosts, canary, batches, the pins pair per stack; what ``--dry`` prints
- ``rollout``    the rollout engine (bump, rollback and ``rigfleet roll``): ``pyinfra ...
                 --limit`` per batch, each host's outcome read back, the stop rule
- ``record``     pure: the pins file after a rollout (``hosts:`` section, history entry)
- ``journal``    the plan and each host's outcome beside the pins file until it records them
- ``images``     keep the previous image, prune older ones, ``docker save`` to a directory
- ``mirror``     copy the promoted image into a mirror registry, digest unchanged
- ``decide``     the inputs, the bumped stacks, the candidate's Genesis, the plan
- ``execute``    the plan carried out: rollout, images, the pins file, rolled-back hosts
- ``finish``     an unfinished bump: finish it, ``--abandon`` it, or wait for it
- ``output``     what the command prints (``rigfleet.tables.Table``) and its exit status
- ``cli``        ``add_parser`` + ``run`` for the ``rigfleet`` console script
"""
