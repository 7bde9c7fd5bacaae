"""The simulated nvidia-smi answers the queries of the host tool's GPU textfile (rigfleet-host
metrics), as the real one does on a GeForce card (ECC counters [N/A])."""

from __future__ import annotations

import io

from test_host_metrics import samples

from rigfleet.hostside import metrics, stackctl
from rigfleet.hostside.metrics import gpu_textfile


def test_the_simulated_nvidia_smi_answers_the_exporters_queries(paths):
    from rigfleet_testbed.nvidia import smi

    for query, width in ((metrics.GPU_QUERY, len(metrics.GPU_FIELDS)), (metrics.ECC_QUERY, 2)):
        out = io.StringIO()
        argv = stackctl.smi_command(query)[1:]
        assert smi.main(argv, version="580.105.08", out=out) == 0, out.getvalue()
        rows = out.getvalue().splitlines()
        assert rows and all(len(r.split(", ")) == width for r in rows), rows
    text = gpu_textfile(*(_ask(smi, q) for q in (metrics.GPU_QUERY, metrics.ECC_QUERY)))
    s = samples(text)
    assert s["rigfleet_gpu_scrape_ok"] == 1
    assert sum(k.startswith("rigfleet_gpu_power_watts{") for k in s) == 2
    assert not any(k.startswith("rigfleet_gpu_ecc") for k in s)  # RTX 3090: [N/A]


def _ask(smi, query: str) -> str:
    out = io.StringIO()
    smi.main(stackctl.smi_command(query)[1:], version="580.105.08", out=out)
    return out.getvalue()
