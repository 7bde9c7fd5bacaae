"""``rigfleet bump``: move the fleet to a newer vLLM image (and Genesis commit), safely: the
candidate checked against Genesis, rolled out canary-first through the deploy's swap
transaction, the pins file written only for what promoted. docs/bump.md tells the sequence
and names the module of each step; ``cli`` is the command::

    rigfleet bump --inventory inventory/home.py --latest --dry
"""
