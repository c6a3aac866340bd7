"""bf16 working copies of member-batched networks (``precision=bf16``).

Mixed precision as under autocast (bf16 matmuls; fp32 master weights, optimizer state, losses and
targets), with the weight casts paid once per optimizer step instead of at every use: each
:class:`~sac_spectral.core.nets.BatchedLinear` gets a bf16 copy of its weight and bias, which its
forward uses while the shared :class:`Bf16Switch` is on. Gradients land on the copies in bf16, as
autocast's matmul backward produces them, and :meth:`Bf16Copies.collect_grads` adds them to the
masters' fp32 gradients (where a regularizer's penalty has put its own) before the optimizer
step; :meth:`Bf16Copies.refresh` re-casts the copies after anything writes the masters (the
optimizer step and interventions, Polyak updates, resets, loading a checkpoint).

Outside the switch (acting, evaluation, diagnostics) the networks run on their fp32 masters.
:func:`make_precision` gives a trainer the one object it talks to: :class:`Fp32` (nothing to do)
or :class:`Bf16` (the copies of its networks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType

import torch
from torch import Tensor, nn

from sac_spectral.core.nets import BatchedLinear


class Bf16Switch:
    """Context manager: the networks' bf16 copies are used inside it."""

    on = False

    def __enter__(self) -> Bf16Switch:
        self.on = True
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.on = False


class Bf16Copies:
    """bf16 copies of every :class:`BatchedLinear` parameter of ``net``, switched by ``switch``;
    ``trainable`` copies collect gradients, the others (target networks) only follow the masters."""

    def __init__(self, net: nn.Module, switch: Bf16Switch, trainable: bool) -> None:
        self.masters: list[Tensor] = []
        self.copies: list[Tensor] = []
        for layer in net.modules():
            if not isinstance(layer, BatchedLinear):
                continue
            masters = [p for p in (layer.weight, layer.bias) if p is not None]
            copies = [p.detach().to(torch.bfloat16).requires_grad_(trainable) for p in masters]
            layer.low = (copies[0], copies[1] if len(copies) > 1 else None, switch)
            self.masters += masters
            self.copies += copies

    @torch.no_grad()
    def refresh(self) -> None:
        """Re-cast the copies from the fp32 masters."""
        torch._foreach_copy_(self.copies, self.masters)

    def collect_grads(self) -> None:
        """Add the copies' gradients to the masters' (fp32) and clear them."""
        for master, copy in zip(self.masters, self.copies):
            if copy.grad is None:
                continue
            if master.grad is None:
                master.grad = copy.grad.float()
            else:
                master.grad.add_(copy.grad)
            copy.grad = None


def full(x: Tensor) -> Tensor:
    """``x`` in fp32 where a bf16 matmul produced it; fp32 (or fp64) outputs as they are."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


PRECISIONS = ("fp32", "bf16")
#: CPU flags (``/proc/cpuinfo``) of native bf16 matmuls: AVX512-BF16 dot products, AMX tiles
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether this CPU multiplies bf16 natively (one of :data:`BF16_FLAGS` among its flags);
    ``None`` where ``cpuinfo`` cannot be read (not Linux): then nothing is claimed either way.
    Without them oneDNN emulates bf16 matmuls, which run slower than fp32 ones."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    return None if flags is None else any(f in flags for f in BF16_FLAGS)


class Fp32:
    """Full precision: the networks run on their own weights; nothing to collect or refresh."""

    def forward(self) -> AbstractContextManager[object]:
        """The context the training losses are computed in."""
        return contextlib.nullcontext()

    def collect_grads(self, net: str) -> None:
        """Move ``net``'s gradients onto its fp32 weights (after ``backward``, before the step)."""

    def refresh(self, *nets: str) -> None:
        """Follow the weights of ``nets`` (every network if none is named) after they were written."""


class Bf16(Fp32):
    """bf16 copies of named networks (``{name: (module, trainable)}``), used inside :meth:`forward`."""

    def __init__(self, nets: Mapping[str, tuple[nn.Module, bool]]) -> None:
        self.switch = Bf16Switch()
        self.copies = {name: Bf16Copies(net, self.switch, trainable) for name, (net, trainable) in nets.items()}

    def forward(self) -> AbstractContextManager[object]:
        return self.switch

    def collect_grads(self, net: str) -> None:
        self.copies[net].collect_grads()

    def refresh(self, *nets: str) -> None:
        for name in nets or tuple(self.copies):
            self.copies[name].refresh()


def make_precision(name: str, nets: Mapping[str, tuple[nn.Module, bool]]) -> Fp32:
    """:class:`Fp32` or :class:`Bf16` copies of ``nets`` for ``name`` in :data:`PRECISIONS`."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision '{name}'; valid: {', '.join(PRECISIONS)}")
    return Bf16(nets) if name == "bf16" else Fp32()
