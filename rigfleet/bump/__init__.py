"""``rigfleet bump``: move the fleet to a newer vLLM image (and Genesis commit), canary first;
docs/bump.md names each step's module, ``cli`` is the command."""
