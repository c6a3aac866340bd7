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
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from sac_spectral.core.native import SOURCES

#: the dtypes whose products go to oneDNN
DTYPES = (torch.float32, torch.bfloat16)

_LIBRARY = torch.library.Library("sac_spectral", "FRAGMENT")
_LIBRARY.define("member_bmm(Tensor a, Tensor b) -> Tensor", tags=(torch.Tag.flexible_layout,))


@torch.library.register_fake("sac_spectral::member_bmm")
def _member_bmm_shape(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty(a.shape[0], a.shape[1], b.shape[2])


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
