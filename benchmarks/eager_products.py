"""The eager SAC update with ATen's products and with oneDNN's (``compile_products: onednn`` where
this machine's measurement chooses it: :func:`sac_spectral.core.onednn.eager_onednn`).

    python -m benchmarks.eager_products [--threads 1] [--repeats 5] [--updates 200]

Both agents (the default config, one seed, batch 256) run alternated rounds of ``--updates``
updates; prints the median ms per update of each, their ratio, and the choice's own measurement
(``onednn.measure``) with the verdict the engine reads for this machine.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import build, interleaved_medians, sac_config, time_updates  # noqa: E402
from benchmarks.machine import machine_line  # noqa: E402
from sac_spectral.core import native, onednn  # noqa: E402
from sac_spectral.core.nets import BatchedLinear  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--updates", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if (why := native.load()) is not None:
        sys.exit(f"oneDNN products are unavailable: {why}")
    agents = {}
    for name in ("aten", "onednn"):
        agent, buf = build(sac_config(compile=False, compile_products="aten"))
        for layer in agent.modules():
            if isinstance(layer, BatchedLinear):
                layer.products = onednn.eager_bmm if name == "onednn" else None
        time_updates(agent, buf, 256, 20)  # warm-up
        agents[name] = (agent, buf)
    load = os.getloadavg()[0]
    print(f"{machine_line()}; {args.threads} thread(s); torch {torch.__version__}; load average {load:.2f}")
    times = interleaved_medians({name: (lambda a=a, b=b: time_updates(a, b, 256, args.updates) * 1e3)
                                 for name, (a, b) in agents.items()}, args.repeats)
    aten, dnn = times["aten"], times["onednn"]
    print(f"eager update, ms (median of {args.repeats} alternated rounds of {args.updates}): "
          f"aten {aten:.2f}, onednn {dnn:.2f}; aten / onednn {aten / dnn:.3f}")
    found, verdict = onednn.measure(), "onednn" if onednn.eager_onednn() else "aten"
    print(f"the choice's measurement (forward and backward of the default networks): aten {found['aten_ms']:.2f} "
          f"ms, onednn {found['onednn_ms']:.2f} ms; this machine's verdict: {verdict}")


if __name__ == "__main__":
    main()
