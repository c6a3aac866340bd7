"""Periodic resets as a regularizer-style schedule (Nikishin et al., "The Primacy Bias in Deep
Reinforcement Learning", ICML 2022), usable on any network, e.g. in supervised runs.

Every ``every`` updates the last ``last`` linear/conv layers (with the normalization layers after
them; ``last = 0``: every layer) are re-drawn from their initializers, each member from its own
random stream (checkpointed), and the optimizer state of their parameters is dropped (Adam's
moments and step restart). This is the same mechanism as the RL agent's ``resets.*``
(:func:`sac_spectral.core.reinit.reset_layers`); the agent's full reset also re-draws targets and α.

Defaults: ``every=1000`` updates (ours), ``last=0``, ``seed=0``. Nikishin et al. reset SAC every
200 k env steps (``resets.every`` in RL configs).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sac_spectral.core.layers import checked_views, layer_tail
from sac_spectral.core.reinit import reset_layers
from sac_spectral.regularizers.base import Regularizer, require
from sac_spectral.regularizers.registry import register


@register
class Reset(Regularizer):
    """Re-draw the network (or its last layers) and clear their optimizer state periodically."""

    name = "reset"
    has_penalty = False

    def __init__(self, module: nn.Module, every: int = 1000, last: int = 0, seed: int = 0) -> None:
        super().__init__(module)
        require(int(every) >= 1, f"every must be an integer >= 1, got {every}")
        require(int(last) >= 0, f"last must be an integer >= 0 (0 = every layer), got {last}")
        self.every = int(every)
        members = checked_views(module, "all", self.name)[0].members
        self.layers = layer_tail(module, int(last) or None)
        self.seed_default(seed, members)
        self.state["resets"] = torch.zeros((), device=next(module.parameters()).device)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        if step % self.every:
            return
        reset_layers(self.layers, self.generators, self._require_optimizer())
        self.state["resets"].add_(1.0)

    def metrics(self) -> dict[str, Tensor]:
        return {"resets": self.state["resets"]}
