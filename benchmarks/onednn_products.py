"""The member-batched products of an update on MKL (``torch.bmm``) and on oneDNN
(``sac_spectral::member_bmm``, what the compiled update uses on the CPU), one thread.

    python benchmarks/onednn_products.py [--rounds 7] [--members 1,2,10,20]

For each member count and each product an update forms with 2×256 networks and batch 256 (the
forward ``x·Wᵀ``, the input gradient ``g·W``, the weight gradient ``gᵀ·x``; operands in the layouts
the compiled update passes), the median over rounds of each kernel's GFLOP/s and their ratio,
timed interleaved in one process. Last, each kernel's cost per call before any arithmetic: the µs
of a 1×1×1 product, called from Python.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import median_per_call_us, per_call_us  # noqa: E402
from benchmarks.machine import machine_line  # noqa: E402
from sac_spectral.core import native  # noqa: E402

BATCH, WIDTH = 256, 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--members", default="1,2,10,20")
    args = parser.parse_args()
    if (why := native.load()) is not None:
        raise SystemExit(f"oneDNN products are unavailable: {why}")
    torch.set_num_threads(1)
    print(f"{machine_line()}; 1 thread; torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'members':>7} {'product':>14} {'MKL GFLOP/s':>12} {'oneDNN GFLOP/s':>15} {'oneDNN / MKL':>13}")
    g = torch.Generator().manual_seed(0)
    for m in (int(v) for v in args.members.split(",")):
        x, w, grad = (torch.randn(m, *shape, generator=g) for shape in ((BATCH, WIDTH), (WIDTH, WIDTH), (BATCH, WIDTH)))
        products = {"forward x·Wᵀ": (x, w.transpose(1, 2)), "input grad g·W": (grad, w),
                    "weight grad gᵀ·x": (grad.transpose(1, 2), x)}
        calls = max(2, 200 // m)
        for name, (a, b) in products.items():
            torch.testing.assert_close(torch.ops.sac_spectral.member_bmm(a, b), torch.bmm(a, b), rtol=1e-4, atol=1e-3)
            times: dict[str, list[float]] = {"mkl": [], "onednn": []}
            for _ in range(args.rounds):
                times["mkl"].append(per_call_us(lambda a=a, b=b: torch.bmm(a, b), calls))
                times["onednn"].append(per_call_us(lambda a=a, b=b: torch.ops.sac_spectral.member_bmm(a, b), calls))
            flops = 2 * m * BATCH * WIDTH * WIDTH
            rate = {k: flops / statistics.median(v) / 1e3 for k, v in times.items()}
            print(f"{m:>7} {name:>14} {rate['mkl']:>12.0f} {rate['onednn']:>15.0f} "
                  f"{rate['onednn'] / rate['mkl']:>13.2f}")
    a, b = torch.ones(1, 1, 1), torch.ones(1, 1, 1)
    per_call = {name: median_per_call_us(fn, 2000, args.rounds, warmup=0) for name, fn in (
        ("torch.bmm", lambda: torch.bmm(a, b)), ("member_bmm", lambda: torch.ops.sac_spectral.member_bmm(a, b)))}
    print("per call, a 1×1×1 product: " + ", ".join(f"{name} {us:.1f} µs" for name, us in per_call.items()))


if __name__ == "__main__":
    main()
