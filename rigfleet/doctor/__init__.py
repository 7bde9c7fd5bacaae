"""``rigfleet doctor``: why a host decodes slower than its baseline or than the fleet
(``evidence``: the probe's ``doctor`` section typed; ``rules``: the causes ranked; ``cli``)."""
