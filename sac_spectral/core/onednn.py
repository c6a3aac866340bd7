"""Member-batched matrix products through oneDNN on the CPU.

ATen's CPU ``bmm`` calls MKL for fp32. On AMD processors MKL takes a narrower code path than on
Intel's: on an AMD EPYC with full-width AVX-512, a 256×256×256 fp32 product runs at ≈ 105 GFLOP/s
in ``torch.bmm`` and ≈ 220 GFLOP/s in oneDNN, which torch also ships (``benchmarks/onednn_products.py``).
The operator ``sac_spectral::member_bmm(a, b)`` is ``torch.bmm(a, b)`` as one oneDNN batched
matmul (``onednn.cpp``: the entry ATen uses for its bf16 products, which reads row-major or
transposed operands in place; one-member operands and operands the members share are passed so
that it does not copy them), its kernel built by :func:`sac_spectral.core.native.load`.
:class:`OneDnnProducts` is an inductor pass over the differentiated graph of a compiled update:
it replaces every fp32 or bf16 CPU ``bmm`` of the forward and backward products with that
operator; the elementwise work around them stays in inductor's fused kernels. Products of the
same operands agree with MKL's to rounding (they sum in another order).

Eager updates reach the operator through :func:`member_bmm`, differentiable (its backward products
are ``member_bmm`` too) under autograd and ``torch.func`` (``grad``, ``vmap``: the operator's
batching rule folds the mapped axis into the members or the rows). The engine hands it to its
fp32 CPU layers (:func:`eager_bmm`, for products large enough to repay its cost per call) where :func:`eager_onednn`
says it is the faster here: a measurement of both on the default agent's layers, taken once per
build of the kernels and kept beside it (:data:`VERDICT`).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from sac_spectral.core import native
from sac_spectral.core.native import SOURCES
from sac_spectral.core.nets import BatchedLinear, BatchedMLP

#: the dtypes whose products go to oneDNN
DTYPES = (torch.float32, torch.bfloat16)

_LIBRARY = torch.library.Library("sac_spectral", "FRAGMENT")
_LIBRARY.define("member_bmm(Tensor a, Tensor b) -> Tensor", tags=(torch.Tag.flexible_layout,))


@torch.library.register_fake("sac_spectral::member_bmm")
def _member_bmm_shape(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty(a.shape[0], a.shape[1], b.shape[2])


def _batched(info: object, in_dims: tuple[int | None, int | None], a: Tensor, b: Tensor) -> tuple[Tensor, int]:
    """``member_bmm``'s batching rule: a mapped axis on both operands joins the members, one on ``a``
    alone its rows, one on ``b`` alone its columns (the other operand is then read once, not expanded)."""
    op = torch.ops.sac_spectral.member_bmm
    mapped_a, mapped_b = in_dims
    if mapped_a is not None and mapped_b is not None:
        a, b = a.movedim(mapped_a, 0), b.movedim(mapped_b, 0)
        v, m, n, p = *a.shape[:3], b.shape[3]
        return op(a.reshape(v * m, n, -1), b.reshape(v * m, -1, p)).view(v, m, n, p), 0
    if mapped_a is not None:
        m, v, n, k = a.movedim(mapped_a, 1).shape
        return op(a.movedim(mapped_a, 1).reshape(m, v * n, k), b).view(m, v, n, b.shape[2]), 1
    m, k, v, p = b.movedim(mapped_b, 2).shape
    return op(a, b.movedim(mapped_b, 2).reshape(m, k, v * p)).view(m, a.shape[1], v, p), 2


torch.library.register_vmap("sac_spectral::member_bmm", _batched)


class MemberBmm(torch.autograd.Function):
    """``member_bmm`` under autograd and ``torch.func``: ``∂a = g·bᵀ``, ``∂b = aᵀ·g`` (both ``member_bmm``)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(a: Tensor, b: Tensor) -> Tensor:
        return torch.ops.sac_spectral.member_bmm(a, b)

    @staticmethod
    def setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        a, b = inputs
        ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b if ctx.needs_input_grad[0] else None)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        return (member_bmm(grad, b.transpose(1, 2)) if ctx.needs_input_grad[0] else None,
                member_bmm(a.transpose(1, 2), grad) if ctx.needs_input_grad[1] else None)


def member_bmm(a: Tensor, b: Tensor) -> Tensor:
    """``torch.bmm(a, b)`` (``a: [M, n, k]``, ``b: [M, k, p]``, fp32 or bf16 on the CPU) on oneDNN,
    differentiable (call :func:`sac_spectral.core.native.load` first)."""
    return MemberBmm.apply(a, b)


#: the fewest multiply-adds of a product that eager layers send to oneDNN: below, its fixed cost per
#: call (≈ 15 µs, against ≈ 1 µs for ``torch.bmm``: ``benchmarks/onednn_products.py``) outweighs its
#: speed (the heads with few outputs, small batches)
MIN_PRODUCT = 1 << 21


def eager_bmm(a: Tensor, b: Tensor) -> Tensor | None:
    """``member_bmm(a, b)`` for an fp32 CPU product of at least :data:`MIN_PRODUCT` multiply-adds that
    autograd records, outside autocast; ``None`` where ATen's product serves: bf16 (ATen's is oneDNN's
    already), autocast (which does not cast this operator), acting and evaluation (no autograd: so that
    a policy played back outside its agent acts as in training), small products."""
    if (a.dtype != torch.float32 or not a.is_cpu or not torch.is_grad_enabled() or torch.is_autocast_enabled("cpu")
            or a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2] < MIN_PRODUCT):
        return None
    return member_bmm(a, b)


#: the file beside the kernels' build that keeps this machine's measurement of the eager products
VERDICT = "eager_products.json"
#: how much faster than ATen's products oneDNN's must measure for eager layers to take them
MARGIN = 1.05
#: ``(members, in, hidden, out)`` of the default agent's networks (cheetah-run: the two critics, the
#: actor's mean and log-std), measured at :data:`BATCH`
NETWORKS = ((2, 23, 256, 1), (1, 17, 256, 12))
BATCH = 256


def measure(rounds: int = 7, repeats: int = 4) -> dict[str, float]:
    """ms of a forward and backward of the :data:`NETWORKS` at :data:`BATCH` with ATen's and with
    oneDNN's products (median of ``rounds`` alternated rounds of ``repeats`` each, on the process's
    threads), and the thread count."""
    g = torch.Generator().manual_seed(0)
    nets = [BatchedMLP(m, i, [h, h], o, generators=[g] * m) for m, i, h, o in NETWORKS]
    inputs = [torch.randn(m, BATCH, i, generator=g) for m, i, _, _ in NETWORKS]
    layers = [layer for net in nets for layer in net.modules() if isinstance(layer, BatchedLinear)]
    times: dict[str, list[float]] = {"aten": [], "onednn": []}
    sides = [("aten", None), ("onednn", eager_bmm)]
    for _ in range(rounds + 1):  # the first round warms both up
        sides.reverse()
        for name, products in sides:
            for layer in layers:
                layer.products = products
            start = time.perf_counter()
            for _ in range(repeats):
                for net, x in zip(nets, inputs):
                    net(x).square().sum().backward()
            times[name].append((time.perf_counter() - start) / repeats * 1e3)
    return {**{f"{name}_ms": statistics.median(t[1:]) for name, t in times.items()}, "threads": torch.get_num_threads()}


def eager_choice(directory: Path, measurement: Callable[[], dict[str, float]] = measure) -> bool:
    """Whether eager products go to oneDNN with the build in ``directory``: its :data:`VERDICT`, or
    else ``measurement()``'s (kept there for the next process where the folder is writable)."""
    path = directory / VERDICT
    try:
        found = json.loads(path.read_text())
        return bool(found["onednn"])
    except (OSError, ValueError, KeyError, TypeError):
        found = measurement()
    found["onednn"] = found["aten_ms"] > MARGIN * found["onednn_ms"]
    try:
        path.with_suffix(f".{os.getpid()}").write_text(json.dumps(found))
        os.replace(path.with_suffix(f".{os.getpid()}"), path)
    except OSError:  # a read-only build serves; the next process measures again
        pass
    return found["onednn"]


@functools.cache
def eager_onednn() -> bool:
    """Whether this machine's eager fp32 CPU products go to oneDNN: where the kernels are built
    (a compiled update builds them; this loads a build, never starts one) and measured faster."""
    return native.load(build=False) is None and eager_choice(native.build_directory())


_SWAP = [0, 2, 1]


class OneDnnProducts(torch._inductor.custom_graph_pass.CustomGraphPass):
    """Inductor's post-grad pass that sends the graph's CPU ``bmm`` products to ``member_bmm``
    (call :func:`sac_spectral.core.native.load` first).
    A product read only through its transpose (autograd's weight gradients, ``(xᵀg)ᵀ``) is formed
    transposed, ``gᵀx``, so that it comes out in the weight's own layout (the fused Adam step reads
    it without a copy)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in graph.find_nodes(op="call_function", target=torch.ops.aten.bmm.default):
            value = node.meta.get("val")
            if value is None or value.device.type != "cpu" or value.dtype not in DTYPES:
                continue
            a, b = node.args
            swapped = [u for u in node.users if u.target == torch.ops.aten.permute.default and list(u.args[1]) == _SWAP]
            if swapped and len(swapped) == len(node.users):
                with graph.inserting_before(node):
                    args = tuple(graph.call_function(torch.ops.aten.permute.default, (t, _SWAP)) for t in (b, a))
                    for arg, t in zip(args, (b, a)):
                        arg.meta["val"] = t.meta["val"].permute(_SWAP)
                    product = graph.call_function(torch.ops.sac_spectral.member_bmm.default, args)
                with value.fake_mode:
                    product.meta["val"] = _member_bmm_shape(*(arg.meta["val"] for arg in args))
                for user in swapped:
                    user.replace_all_uses_with(product)
                    graph.erase_node(user)
            else:
                with graph.inserting_before(node):
                    product = graph.call_function(torch.ops.sac_spectral.member_bmm.default, node.args)
                product.meta.update(node.meta)
                node.replace_all_uses_with(product)
            graph.erase_node(node)

    def uuid(self) -> bytes:
        """The hash of this file and the kernels': inductor's cache keys a program by its passes."""
        return torch._inductor.custom_graph_pass.get_hash_for_files((str(Path(__file__).resolve()), *map(str, SOURCES)))
