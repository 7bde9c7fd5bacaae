"""``rigfleet bump``: move the fleet to a newer vLLM image (and Genesis commit), canary first,
through the deploy's swap transaction; docs/bump.md names each step's module, ``cli`` is the
command (its docstring has the usage)."""
