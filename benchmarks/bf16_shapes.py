"""bf16 against fp32 for each matmul shape of a SAC update: why bf16 pays with many seeds only.

    python -m benchmarks.bf16_shapes [--threads 2] [--members 1 2 10 20] [--batch 256]

For every linear layer shape of the default agent on cheetah-run (obs 17, action 6; critic input
23, output 1; actor hidden 256, heads 6 and the 12 of both heads together) and every member count
(the actor has one member per seed, the critic two), times the three products a layer's forward
and backward run, as :class:`~sac_spectral.core.nets.BatchedLinear` forms them: the forward
``baddbmm(b, W, xᵀ)`` ``[M, out, in] × [M, in, B]``, the weight gradient ``[M, out, B] × [M, B, in]``
and the input gradient ``[M, in, out] × [M, out, B]``. Prints µs per call in fp32 and bf16 and
their ratio (> 1: bf16 faster), medians of interleaved repeats. Also times the forward without
the fused bias (``bmm``), which shows what the bias costs in each precision.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from benchmarks.common import interleaved_medians, per_call_us

SHAPES = ((17, 256), (23, 256), (256, 256), (256, 6), (256, 12), (256, 1))


def products(members: int, fan_in: int, fan_out: int, batch: int,
             dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """The layer's four products (forward with and without bias, weight and input gradients)."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    w, x, b = rand(members, fan_out, fan_in), rand(members, fan_in, batch), rand(members, fan_out, 1)
    gy, xr, wt = rand(members, fan_out, batch), rand(members, batch, fan_in), rand(members, fan_in, fan_out)
    return {
        "forward": lambda: torch.baddbmm(b, w, x),
        "forward, no bias": lambda: torch.bmm(w, x),
        "weight grad": lambda: torch.bmm(gy, xr),
        "input grad": lambda: torch.bmm(wt, gy),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--members", type=int, nargs="+", default=[1, 2, 10, 20])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads} batch={args.batch}; µs per call fp32 / bf16 (ratio fp32/bf16), medians of "
          f"{args.repeats}")
    names = list(products(1, 1, 1, 1, torch.float32))
    print(f"{'M':>3s} {'in':>4s} {'out':>4s}  " + "  ".join(f"{n:>24s}" for n in names))
    for members in args.members:
        for fan_in, fan_out in SHAPES:
            timed = {
                (dt, n): (lambda fn=fn: per_call_us(fn, 100))
                for dt in (torch.float32, torch.bfloat16)
                for n, fn in products(members, fan_in, fan_out, args.batch, dt).items()
            }
            for run in timed.values():
                run()
            medians = interleaved_medians(timed, args.repeats)
            cells = []
            for n in names:
                fp, bf = medians[torch.float32, n], medians[torch.bfloat16, n]
                cells.append(f"{fp:7.1f} / {bf:6.1f} ({fp / bf:4.2f}x)")
            print(f"{members:3d} {fan_in:4d} {fan_out:4d}  " + "  ".join(f"{c:>24s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
