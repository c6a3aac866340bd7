"""Each side's matmul time inside its real update, for ``benchmarks/vs_jax.py --split``: what of an
update is matrix products and what is the rest (elementwise kernels, sampling, dispatch).

Both are profiles of one timed block, run as the benchmark runs it:

- Ours: ``torch.profiler`` over the block; the self time of the ATen matmul calls (``mm``, ``bmm``,
  ``addmm``, ``baddbmm``: MKL) and of the compiled update's oneDNN products
  (``sac_spectral::member_bmm``, :mod:`sac_spectral.core.onednn`: its output's allocation included).
- JAX: ``jax.profiler`` over the block; XLA:CPU records each thunk it runs, and the matmul thunks
  are the ``dot`` ones and the YNNPACK/XNNPACK/oneDNN fusions XLA hands its dots to (which may
  carry a fused elementwise epilogue: bias, ReLU).

Each returns a function that runs one profiled block and gives the matmul seconds per update.
Profiling slows the rest of the block, not the kernels, so the rest is the unprofiled block time
less this.
"""

from __future__ import annotations

import glob
import tempfile
from collections.abc import Callable
from typing import Any

MATMULS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "sac_spectral::member_bmm")
#: name fragments of XLA:CPU's matmul thunks
XLA_MATMULS = ("dot", "ynn", "xnn", "onednn", "gemm")


def torch_matmuls(run: Callable[[], None], updates: int) -> Callable[[], float]:
    """Matmul seconds per update of ``run`` (``updates`` updates), from the ATen calls' self time."""
    from torch.profiler import ProfilerActivity, profile

    def measure() -> float:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in MATMULS) / 1e6 / updates

    return measure


def jax_matmuls(run: Callable[[], None], updates: int) -> Callable[[], float]:
    """Matmul seconds per update of ``run`` (``updates`` updates), from XLA:CPU's thunk events."""
    import jax
    from jax.profiler import ProfileData

    def matmul(name: str) -> bool:
        return not name.startswith("end:") and any(k in name.lower() for k in XLA_MATMULS)

    def measure() -> float:
        with tempfile.TemporaryDirectory() as tmp:
            with jax.profiler.trace(tmp):
                run()
            data: Any = ProfileData.from_file(glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True)[0])
            ns = sum(e.duration_ns for plane in data.planes if plane.name == "/host:CPU"
                     for line in plane.lines if line.name != "python" for e in line.events if matmul(e.name))
        return ns / 1e9 / updates

    return measure
