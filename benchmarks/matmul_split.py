"""Each side's matmuls alone, for ``benchmarks/vs_jax.py --split``: what of an update is matrix
products and what is the rest (elementwise kernels, sampling, dispatch).

- Ours: the leaf ATen matmul calls (``mm``, ``bmm``, ``addmm``, ``baddbmm``) of K updates, recorded by
  ``torch.profiler`` with their input shapes, then replayed on random contiguous tensors of those
  shapes from Python, one call each (as inductor's wrapper calls its extern matmuls).
- JAX: the ``dot_general``s of one update's jaxpr (``jax.make_jaxpr`` of the jitted, seed-vmapped
  step, sub-jaxprs included), each as the batched product ``[B, M, K] @ [B, K, N]`` of its sizes
  (the layout XLA's layout assignment would pick for it), run as one jitted program of those
  products alone on random inputs.

Each returns a function giving seconds per update. Layouts differ from the real programs (inputs
here are contiguous; XLA picks its own layouts in the real one), so the split is an estimate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

MATMULS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")
#: positional tensor inputs of each recorded op (the rest are beta/alpha scalars or ``out``)
ARITY = {"aten::mm": 2, "aten::bmm": 2, "aten::addmm": 3, "aten::baddbmm": 3}


def torch_matmuls(run: Callable[[], None], updates: int) -> Callable[[], float]:
    """Seconds per update of replaying the leaf matmuls that ``run`` (``updates`` updates) calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()

    def leaf(e: Any) -> bool:
        parent = e.cpu_parent
        while parent is not None:
            if parent.name in MATMULS:
                return False
            parent = parent.cpu_parent
        return True

    g = torch.Generator().manual_seed(0)
    calls = [(getattr(torch, e.name.removeprefix("aten::")),
              [torch.randn(*shape, generator=g) for shape in e.input_shapes[: ARITY[e.name]]])
             for e in prof.events() if e.name in MATMULS and leaf(e)]

    def replay() -> float:
        t = time.perf_counter()
        for op, args in calls:
            op(*args)
        return (time.perf_counter() - t) / updates

    return replay


def jax_matmuls(fn: Callable[..., Any], *args: Any) -> Callable[[], float]:
    """Seconds per call of one jitted program of the ``dot_general``s that ``fn(*args)`` (one update)
    traces to."""
    import jax
    import numpy as np
    from jax.extend.core import jaxprs_in_params

    dims: list[tuple[int, int, int, int]] = []  # (batch, m, k, n) of each product

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                lhs, rhs = (v.aval.shape for v in eqn.invars)
                (lc, _), (lb, _) = eqn.params["dimension_numbers"]
                batch, k = math.prod(lhs[i] for i in lb), math.prod(lhs[i] for i in lc)
                dims.append((batch, math.prod(lhs) // (batch * k), k, math.prod(rhs) // (batch * k)))
            for sub in jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    rng = np.random.default_rng(0)
    operands = jax.device_put([(rng.standard_normal((b, m, k), np.float32), rng.standard_normal((b, k, n), np.float32))
                               for b, m, k, n in dims])
    products = jax.jit(lambda ops: [a @ b for a, b in ops])
    jax.block_until_ready(products(operands))

    def call() -> float:
        t = time.perf_counter()
        jax.block_until_ready(products(operands))
        return time.perf_counter() - t

    return call
