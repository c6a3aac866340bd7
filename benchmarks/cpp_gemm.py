"""Inductor's C++ GEMM templates in the compiled update: can the bias and ReLU run in the GEMM's
epilogue on this CPU, and what does it save?

    python benchmarks/cpp_gemm.py [--rounds 9] [--updates 40] [--seeds 1] [--spectral]

1. One layer, ``relu(x·Wᵀ + b)`` with ``[M, 256, 256]`` operands, compiled three ways and timed
   (µs, median of 7 blocks of 200 calls): inductor's C++ GEMM template with ``max_autotune`` (the bias and ReLU in the
   GEMM's epilogue), the shipped oneDNN product with the bias and ReLU in a separate fused kernel,
   and ATen's ``bmm`` (MKL) with the same kernel.
2. Four compiled updates of the same agent (plain SAC, cheetah-run shapes, 2×256, batch 256, one
   thread), timed interleaved in one process, medians over rounds and the median per-round ratio:

   - ``today``: the shipped compiled update (oneDNN products as extern kernels);
   - ``mm``: layers with one member (the actor at one seed) as a 2-D ``mm`` under compile, ATen's;
   - ``mm+cpp``: the same with ``max_autotune`` and the ``CPP,ATEN`` GEMM backends;
   - ``bmm+cpp``: every product (the oneDNN pass off) autotuned between inductor's ``bmm`` template
     and ATen's, with the template's epilogue fixed (below). After 3 updates from the same start
     its parameters are compared with ``today``'s (the largest difference is printed).

Inductor's ``bmm`` template (torch 2.13) fails where a product's output has users besides its
epilogue (the pre-activation the ReLU's backward reads): it then copies its local accumulator to the
3-D output with an in-template epilogue whose loader gets the 2-D per-member index, an
``AssertionError`` in ``ir.indexer``. ``_bmm_options`` prepends the member index to those epilogues'
(missing) reindexers, as the template does for its other epilogues.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import build, median_per_call_us, sac_config, time_updates  # noqa: E402
from benchmarks.machine import machine_line  # noqa: E402
from sac_spectral.core import native, nets, onednn  # noqa: E402

MM = {"on": False}
BMM = {"on": False}
CPP = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
_forward = nets.BatchedLinear.forward


def _forward_mm(self: nets.BatchedLinear, x: torch.Tensor, detach: bool = False) -> torch.Tensor:
    """A one-member layer as ``mm`` while a variant that asks for it is traced."""
    if not (MM["on"] and torch.compiler.is_compiling() and self.weight.shape[0] == 1):
        return _forward(self, x, detach)
    w, b = (self.weight.detach(), self.bias.detach()) if detach else (self.weight, self.bias)
    y = torch.mm(x[0], w[0].t())
    return (y + b[0]).unsqueeze(0)


def _patch_bmm_template() -> None:
    """Turn inductor's ``bmm`` template on only while ``bmm+cpp`` compiles, with its in-template
    epilogues indexed per member."""
    import torch._inductor.kernel.bmm as inductor_bmm
    from torch._inductor.codegen.cpp_bmm_template import CppBmmTemplate

    shipped_use, shipped_options = inductor_bmm.use_cpp_bmm_template, CppBmmTemplate.get_options
    inductor_bmm.use_cpp_bmm_template = lambda *a, **k: BMM["on"] and shipped_use(*a, **k)

    def _bmm_options(self: CppBmmTemplate, *args: Any, **kwargs: Any) -> dict[str, Any]:
        options = shipped_options(self, *args, **kwargs)
        member = self.b_index
        options["reindexers"] = [r if r is not None else (lambda index: [member, *index])
                                 for r in options["reindexers"]]
        return options

    CppBmmTemplate.get_options = _bmm_options


def layers() -> None:
    """Table 1: one layer's forward, with and without the epilogue in the GEMM."""
    def layer(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.bmm(x, w.transpose(1, 2)) + b.unsqueeze(1))

    variants = {"C++ template, fused epilogue": (CPP, True), "oneDNN + kernel": (
        {"post_grad_custom_post_pass": onednn.OneDnnProducts()}, False), "MKL + kernel": ({}, False)}
    print(f"{'members':>7}" + "".join(f"{name:>30}" for name in variants) + "   (µs per layer forward)")
    for members in (1, 2, 10):
        x, w, b = torch.randn(members, 256, 256), torch.randn(members, 256, 256), torch.randn(members, 256)
        row = []
        for options, template in variants.values():
            BMM["on"] = template
            torch._dynamo.reset()
            compiled = torch.compile(layer, dynamic=False, options=options)
            compiled(x, w, b)
            BMM["on"] = False
            row.append(median_per_call_us(lambda compiled=compiled, x=x, w=w, b=b: compiled(x, w, b), 200, 7,
                                          warmup=20))
        print(f"{members:>7}" + "".join(f"{t:>30.1f}" for t in row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--spectral", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if (why := native.load()) is not None:
        sys.exit(f"cpp_gemm: the oneDNN products are unavailable here: {why}")
    _patch_bmm_template()
    load = os.getloadavg()[0]
    layers()
    nets.BatchedLinear.forward = _forward_mm
    agents = {}
    for name, mm, bmm, products, options in (("today", False, False, "onednn", {}), ("mm", True, False, "onednn", {}),
                                             ("mm+cpp", True, False, "onednn", CPP),
                                             ("bmm+cpp", False, True, "aten", CPP)):
        agent, buf = build(sac_config(spectral=args.spectral, compile=True, compile_products=products), args.seeds)
        shipped = agent.backend._compile.keywords["options"]
        agent.backend._compile = functools.partial(torch.compile, dynamic=False, options={**shipped, **options})
        MM["on"], BMM["on"] = mm, bmm
        start = time.perf_counter()
        agent.train_steps(buf, 3, 256)
        print(f"{name}: compiled in {time.perf_counter() - start:.0f} s", flush=True)
        agents[name] = agent
    MM["on"] = BMM["on"] = False
    reference = agents["today"].state_dict()
    diff = max((p - reference[k]).abs().max().item() for k,
               p in agents["bmm+cpp"].state_dict().items() if p.is_floating_point())
    print(f"bmm+cpp against today after 3 updates: largest parameter difference {diff:.1e}")
    times: dict[str, list[float]] = {n: [] for n in agents}
    for r in range(args.rounds):
        for name in list(agents) if r % 2 == 0 else list(agents)[::-1]:
            times[name].append(time_updates(agents[name], buf, 256, args.updates) * 1e3)
    print(f"{machine_line()}; 1 thread; {args.seeds} seed(s); "
          f"load average {load:.2f} → {os.getloadavg()[0]:.2f}")
    for name, values in times.items():
        ratio = statistics.median(v / t for v, t in zip(values, times["today"]))
        print(f"{name:>8}: {statistics.median(values):.3f} ms/update, / today {ratio:.3f}")


if __name__ == "__main__":
    main()
