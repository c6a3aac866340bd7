"""Inductor's C++ GEMM templates in the compiled update: can the bias and ReLU run in the GEMM's
epilogue on this CPU, and what does it save?

    python benchmarks/cpp_gemm.py [--rounds 9] [--updates 40] [--seeds 1] [--spectral]

Three compiled updates of the same agent (plain SAC, cheetah-run shapes, 2×256, batch 256, one
thread), timed interleaved in one process, medians over rounds and the median per-round ratio:

- ``today``: the shipped compiled update (its products as oneDNN batched matmuls called as
  extern kernels, bias and ReLU in a separate fused kernel);
- ``mm``: layers with one member (the actor at one seed) as a 2-D ``mm`` under compile, ATen's;
- ``mm+cpp``: the same with ``max_autotune`` and the ``CPP`` GEMM backend, which can fuse the bias
  and ReLU into the GEMM (inductor autotunes each product between its template and ATen).

Inductor's ``bmm`` template stays off in ``mm+cpp``: with an epilogue whose input has other users
(the pre-activation that the ReLU's backward reads), it copies its local accumulator with a 2-D
index into the 3-D output and fails (``AssertionError`` in ``ir.indexer``, torch 2.13). The
critics (two members) and every layer at several seeds are ``bmm``s, so they are not affected.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import build, sac_config, time_updates  # noqa: E402
from sac_spectral.core import nets  # noqa: E402

MM = {"on": False}
_forward = nets.BatchedLinear.forward


def _forward_mm(self: nets.BatchedLinear, x: torch.Tensor, detach: bool = False) -> torch.Tensor:
    """A one-member layer as ``mm`` while a variant that asks for it is traced."""
    if not (MM["on"] and torch.compiler.is_compiling() and self.weight.shape[0] == 1):
        return _forward(self, x, detach)
    w, b = (self.weight.detach(), self.bias.detach()) if detach else (self.weight, self.bias)
    y = torch.mm(x[0], w[0].t())
    return (y + b[0]).unsqueeze(0)


def cpu_flags() -> str:
    flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0] if platform.system() == "Linux" else ""
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f" {f}" in flags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--spectral", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    nets.BatchedLinear.forward = _forward_mm
    import torch._inductor.kernel.bmm as inductor_bmm

    inductor_bmm.use_cpp_bmm_template = lambda *a, **k: False
    cpp = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
    agents = {}
    for name, mm, options in (("today", False, {}), ("mm", True, {}), ("mm+cpp", True, cpp)):
        agent, buf = build(sac_config(spectral=args.spectral, compile=True), args.seeds)
        shipped = agent.backend._compile.keywords["options"]
        agent.backend._compile = functools.partial(torch.compile, dynamic=False, options={**shipped, **options})
        MM["on"] = mm
        start = time.perf_counter()
        agent.train_steps(buf, 3, 256)
        print(f"{name}: compiled in {time.perf_counter() - start:.0f} s", flush=True)
        agents[name] = agent
    MM["on"] = False
    times: dict[str, list[float]] = {n: [] for n in agents}
    load = os.getloadavg()[0]
    for r in range(args.rounds):
        for name in list(agents) if r % 2 == 0 else list(agents)[::-1]:
            times[name].append(time_updates(agents[name], buf, 256, args.updates) * 1e3)
    print(f"cpu: {platform.processor() or platform.machine()} flags: {cpu_flags()}; 1 thread; {args.seeds} seed(s); "
          f"load average {load:.2f} → {os.getloadavg()[0]:.2f}")
    for name, values in times.items():
        ratio = statistics.median(v / t for v, t in zip(values, times["today"]))
        print(f"{name:>8}: {statistics.median(values):.3f} ms/update, / today {ratio:.3f}")


if __name__ == "__main__":
    main()
