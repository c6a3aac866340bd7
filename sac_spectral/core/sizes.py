"""Sizes of what a trainer allocates, measured without allocating it: parameter and activation
counts of modules built on PyTorch's meta device (nothing is allocated, no random number is
drawn). The memory estimates of agents and learners are built from these."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

FLOAT32 = 4
#: tensors per trainable parameter while training with Adam: the value, its gradient, two moments
ADAM_COPIES = 4


def parameter_count(build: Callable[[], nn.Module]) -> int:
    """Parameters of the module ``build()`` returns, built on the meta device."""
    with torch.random.fork_rng(), torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


def model_size(build: Callable[[], nn.Module], input_shape: Sequence[int]) -> tuple[int, int]:
    """``(parameters, activations per example)`` of the module ``build()`` returns, measured on the
    meta device: every leaf module's output counts."""
    with torch.random.fork_rng(), torch.device("meta"):
        model = build()
        count = 0

        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            nonlocal count
            if isinstance(output, torch.Tensor):
                count += output[0].numel()

        handles = [m.register_forward_hook(hook) for m in model.modules() if not any(m.children())]
        model.eval()  # batch statistics of one example are undefined in training mode
        try:
            model(torch.empty(1, *input_shape))
        except Exception:  # noqa: BLE001 - an op without a meta kernel: count the parameters only
            count = 0
        finally:
            for h in handles:
                h.remove()
    return sum(p.numel() for p in model.parameters()), count
