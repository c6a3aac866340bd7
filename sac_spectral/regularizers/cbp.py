"""Continual backpropagation, CBP (Dohare, Hernandez-Garcia, Lan, Rahman, Mahmood, Sutton,
"Loss of plasticity in deep continual learning", Nature 632, 2024).

After every optimizer step, on a probe batch (``set_probe``; the RL agent passes the current replay
batch, a supervised loop its training batch) and separately for each member, every hidden unit
``i`` of a layer gets one more step of age and of its contribution utility

    u_i ← η·u_i + (1 − η)·c_i,    c_i = Σ_f E_x|h_f(x)| · Σ_k |w_kf|,

where ``f`` runs over the unit's features as the next layer sees them (after normalization and
activation; one feature for a plain unit, two for CReLU, a conv channel's block of positions after
``Flatten``; a conv consumer sees the channel with its mean over positions) and ``k`` over every
outgoing weight of ``f`` in the next layer(s) (all heads of a multi-head network). For a plain unit
``c_i = mean_x |h_i(x)| · Σ_k |w_ki|``, the paper's contribution utility. Units are ranked by the
bias-corrected ``û_i = u_i / (1 − η^{age_i})`` (Adam-style, as the authors' code does), so that
young units' averages are not biased toward 0.

Replacement, per layer: units with ``age > maturity_threshold`` are eligible; every step adds
``replacement_rate × (number of eligible units)`` to a fractional accumulator ``n``, and the
``⌊n⌋`` eligible units with the lowest ``û`` (at most all eligible ones) are replaced and ``n``
decreases by that count (the paper's algorithm: a rate per eligible unit, fractional counts
carried over). Replacing unit ``i``: its incoming weights and bias (and its gain/shift in a
normalization layer after it) are re-drawn from the layer's initializer, its outgoing weights are
set to 0 (the network's function is unchanged up to the unit's removed contribution), ``u_i`` and
``age_i`` are reset to 0, and the optimizer's per-element state of exactly those entries (Adam's
``exp_avg``, ``exp_avg_sq``) is zeroed. Draws come from each member's random stream
(checkpointed). Ages do not depend on the data, so every member replaces the same number of units
at the same steps (which units differs); the counting is done on the host, the selection on the
device without a host sync.

Not included: the authors' variants that divide by the incoming weights' magnitude or subtract the
running mean of the activation ("adaptable contribution"), and the code's compensation of the
next layer's bias by the removed unit's mean contribution.

Layer order must be known, as for ReDo: a :class:`~sac_spectral.core.nets.BatchedMLP` or an
``nn.Sequential`` of linear/conv layers, normalization layers, activations, pooling and ``Flatten``.
The probe forward runs in eval mode, once per step (about one more forward of the probe batch).

Defaults (the paper's): ``replacement_rate=1e-4``, ``maturity_threshold=100``, ``decay_rate=0.99``;
``seed=0``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from sac_spectral.core.layers import checked_views
from sac_spectral.core.reinit import draw, members_view
from sac_spectral.regularizers.base import Regularizer, require
from sac_spectral.regularizers.redo import HiddenLayer, feature_scores, hidden_layers
from sac_spectral.regularizers.registry import register


def outgoing_magnitude(consumer: nn.Module) -> Tensor:
    """``Σ_k |w_kf|`` for every input feature ``f`` of ``consumer`` (a conv's input channel: summed
    over the kernel's positions too): ``[M, in]``."""
    w = members_view(consumer.weight, consumer).abs()
    dims = [1] + list(range(3, w.dim()))
    return w.sum(dim=dims)


def _broadcast(mask: Tensor, target: Tensor, axis: int) -> Tensor:
    """``mask [M, n]`` shaped to broadcast against a member view ``target [M, …]`` along ``axis``
    (1 = the layer's output units, 2 = a consumer's input features)."""
    shape = [mask.shape[0]] + [1] * (target.dim() - 1)
    shape[axis] = mask.shape[1]
    return mask.view(shape)


@register
class CBP(Regularizer):
    """Continually replace a small fraction of the mature hidden units with the lowest utility."""

    name = "cbp"
    has_penalty = False

    def __init__(
        self,
        module: nn.Module,
        replacement_rate: float = 1e-4,
        maturity_threshold: int = 100,
        decay_rate: float = 0.99,
        seed: int = 0,
    ) -> None:
        super().__init__(module)
        members = checked_views(module, "all", self.name)[0].members
        require(0.0 <= replacement_rate <= 1.0, f"replacement_rate must be in [0, 1], got {replacement_rate}")
        require(int(maturity_threshold) >= 0, f"maturity_threshold must be an integer >= 0, got {maturity_threshold}")
        require(0.0 <= decay_rate < 1.0, f"decay_rate must be in [0, 1), got {decay_rate}")
        self.rate, self.maturity, self.decay = float(replacement_rate), int(maturity_threshold), float(decay_rate)
        try:
            self.layers: list[HiddenLayer] = hidden_layers(module)
        except ValueError as err:
            raise ValueError(str(err).replace("redo", self.name, 1)) from None
        require(len(self.layers) > 0, "cbp: the module has no hidden layer")
        self.seed_default(seed, members)
        ref = next(module.parameters())
        for i, layer in enumerate(self.layers):
            units = _units(layer.producer)
            self.state[f"utility{i}"] = torch.zeros(members, units, device=ref.device, dtype=ref.dtype)
            self.state[f"age{i}"] = torch.zeros(members, units, device=ref.device, dtype=torch.long)
        # host side: the fractional accumulators, and (rebuilt from the ages) how many units have each age
        self.state["accumulated"] = torch.zeros(len(self.layers), dtype=torch.float64)
        self.state["replaced"] = torch.zeros(members, device=ref.device)
        self._ages = [self._histogram(np.zeros(_units(layer.producer), dtype=np.int64)) for layer in self.layers]

    def _histogram(self, ages: np.ndarray) -> np.ndarray:
        """Units per age ``0 … maturity_threshold``, then the mature ones (age above it)."""
        return np.bincount(np.minimum(ages, self.maturity + 1), minlength=self.maturity + 2)

    @torch.no_grad()
    def contributions(self) -> list[Tensor]:
        """This step's contribution ``c_i`` of every hidden unit on one probe batch: ``[M, H]`` per layer."""
        if self.probe is None:
            raise RuntimeError("cbp: call set_probe(fn) first; fn() returns a batch of the network's inputs")
        feats = feature_scores(self.module, self.layers, self.probe())
        out = []
        for i, layer in enumerate(self.layers):
            magnitude = sum(outgoing_magnitude(c) for c in layer.consumers)
            per_feature = feats[i] * magnitude
            # the mean over a unit's features, times their number
            out.append(layer.unit_scores(per_feature) * layer.groups)
        return out

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        self._require_optimizer()
        contributions = self.contributions()
        counts = []
        for i, c in enumerate(contributions):
            utility, age = self.state[f"utility{i}"], self.state[f"age{i}"]
            age.add_(1)
            utility.mul_(self.decay).add_(c, alpha=1.0 - self.decay)
            hist = self._ages[i]
            hist[-1] += hist[-2]
            hist[1:-1] = hist[:-2].copy()
            hist[0] = 0
            eligible = int(hist[-1])
            acc = float(self.state["accumulated"][i]) + self.rate * eligible
            count = min(int(acc), eligible)
            self.state["accumulated"][i] = acc - count
            counts.append(count)
            if count:
                hist[-1] -= count
                hist[0] += count
                self._replace(i, self._lowest(utility, age, count))
        total = sum(counts)
        if total:
            self.state["replaced"].add_(float(total))

    def _lowest(self, utility: Tensor, age: Tensor, count: int) -> Tensor:
        """The ``count`` eligible units of lowest bias-corrected utility, per member, as a mask ``[M, H]``."""
        corrected = utility / (1.0 - self.decay ** age) if self.decay > 0 else utility
        corrected = corrected.masked_fill(age <= self.maturity, float("inf"))
        idx = torch.topk(corrected, count, dim=1, largest=False).indices
        return torch.zeros_like(utility, dtype=torch.bool).scatter_(1, idx, True)

    def _replace(self, i: int, mask: Tensor) -> None:
        """Re-draw the incoming side of the units ``mask [M, H]`` of hidden layer ``i``, zero their
        outgoing weights, utility and age, and the optimizer state of those entries."""
        layer = self.layers[i]
        for mod in (layer.producer, *layer.norms):
            fresh = [draw(mod, g) for g in self.generators]
            for j, param in enumerate((mod.weight, getattr(mod, "bias", None))):
                if param is None or fresh[0][j] is None:
                    continue
                target = members_view(param, mod)
                new = torch.stack([f[j] for f in fresh]).to(target)
                units = _broadcast(mask, target, 1)
                target.copy_(torch.where(units, new, target))
                self._zero_state(param, mod, units)
        features = _feature_mask(layer, mask)
        for consumer in layer.consumers:
            target = members_view(consumer.weight, consumer)
            cols = _broadcast(features, target, 2)
            target.masked_fill_(cols, 0.0)
            self._zero_state(consumer.weight, consumer, cols)
        self.state[f"utility{i}"].masked_fill_(mask, 0.0)
        self.state[f"age{i}"].masked_fill_(mask, 0)

    def _zero_state(self, param: Tensor, module: nn.Module, mask: Tensor) -> None:
        optimizer = self._require_optimizer()
        for value in optimizer.state.get(param, {}).values():
            if isinstance(value, Tensor) and value.shape == param.shape:
                members_view(value, module).masked_fill_(mask, 0.0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._ages = [self._histogram(self.state[f"age{i}"][0].cpu().numpy()) for i in range(len(self.layers))]

    def metrics(self) -> dict[str, Tensor]:
        """``replaced``: units replaced so far (all layers); ``utility``: mean utility of the hidden units."""
        mean = torch.stack([self.state[f"utility{i}"].mean(dim=1) for i in range(len(self.layers))]).mean(dim=0)
        return {"replaced": self.state["replaced"], "utility": mean}


def _units(layer: nn.Module) -> int:
    return layer.out_channels if isinstance(layer, nn.modules.conv._ConvNd) else layer.out_features


def _feature_mask(layer: HiddenLayer, units: Tensor) -> Tensor:
    """The consumer-input features of the units ``[M, H]``: ``[M, in]`` (HiddenLayer's layout)."""
    if layer.interleaved:
        return units.repeat(1, layer.groups)
    return units.repeat_interleave(layer.groups, dim=1)
