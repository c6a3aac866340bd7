"""ReDo: recycle dormant units (Sokar, Agarwal, Castro, Evci, "The Dormant Neuron Phenomenon in
Deep Reinforcement Learning", ICML 2023).

Every ``every`` updates, on a probe batch (``set_probe``; the RL agent passes the current replay
batch) and separately for each member, each hidden unit ``i`` of a layer with ``H`` units gets

    s_i = E_x |h_i(x)| / ( (1/H) Σ_j E_x |h_j(x)| ),

``h`` being the unit's activation as the next layer sees it (after normalization and activation;
a CReLU unit's two outputs are averaged, a conv channel's outputs over positions; the probe
forward runs in eval mode, so it updates no BatchNorm statistics). Units with
``s_i ≤ tau`` are dormant. For each of them: its incoming weights and bias (and its gain/shift in
a normalization layer right after it) are re-drawn from the layer's initializer, its outgoing
weights in the next layer are set to zero, and the optimizer's per-element state of exactly those
entries (Adam's ``exp_avg``, ``exp_avg_sq``) is zeroed; Adam's per-tensor ``step`` is shared by
the whole tensor and stays. Everything else is unchanged bit for bit. Draws come from the
member's own random stream (checkpointed).

Layer order must be known: a :class:`~sac_spectral.core.nets.BatchedMLP` or an ``nn.Sequential``
(nested Sequentials allowed) of linear/conv layers, normalization layers, activations, pooling
and ``Flatten`` (a conv channel then owns its block of the flattened features).

Defaults: ``tau=0.1`` (RL; Sokar et al. 2023 use 0.025 in some settings),
``every=1000`` updates (ours; Sokar et al. recycle periodically), ``seed=0``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from sac_spectral.core.layers import NORMS, WEIGHTED, checked_views
from sac_spectral.core.nets import BatchedLayerNorm, BatchedMLP
from sac_spectral.core.reinit import draw, member_count, member_param, zero_moments
from sac_spectral.diagnostics.features import normalized_scores
from sac_spectral.regularizers.base import Regularizer, require
from sac_spectral.regularizers.registry import register


def _units(layer: nn.Module) -> int:
    return layer.out_channels if isinstance(layer, nn.modules.conv._ConvNd) else layer.out_features


def _inputs(layer: nn.Module) -> int:
    return layer.in_channels if isinstance(layer, nn.modules.conv._ConvNd) else layer.in_features


def _norm_features(norm: nn.Module) -> int:
    if isinstance(norm, BatchedLayerNorm):
        return norm.features
    if isinstance(norm, nn.LayerNorm):
        return norm.normalized_shape[0]
    return norm.num_channels if isinstance(norm, nn.GroupNorm) else norm.num_features


@dataclass
class HiddenLayer:
    """A layer whose units ReDo recycles, and the layers its units' activations go to."""

    producer: nn.Module
    consumers: list[nn.Module]
    groups: int = 1
    #: CReLU layout (unit j → features j, j+H, …) if True, flattened-channel blocks otherwise
    interleaved: bool = True
    norms: list[nn.Module] = field(default_factory=list)

    def feature_scores(self, x: Tensor) -> Tensor:
        """Mean |activation| of every input feature of the consumers, ``x`` being their input: ``[M, in]``."""
        consumer = self.consumers[0]
        if isinstance(consumer, nn.modules.conv._ConvNd):
            return x.abs().transpose(0, 1).flatten(1).mean(dim=1).unsqueeze(0)
        return x.abs().reshape(member_count(consumer), -1, x.shape[-1]).mean(dim=1)

    def unit_scores(self, feats: Tensor) -> Tensor:
        """Per-unit mean over its features: ``[M, H]``."""
        m, h = feats.shape[0], _units(self.producer)
        if self.interleaved:
            return feats.reshape(m, self.groups, h).mean(dim=1)
        return feats.reshape(m, h, self.groups).mean(dim=2)

    def feature_mask(self, dormant: Tensor) -> Tensor:
        """The consumer-input features of the dormant units ``[H]``: ``[in]``."""
        if self.interleaved:
            return dormant.repeat(self.groups)
        return dormant.repeat_interleave(self.groups)


def hidden_layers(module: nn.Module) -> list[HiddenLayer]:
    """The hidden layers of a BatchedMLP or an nn.Sequential, in order, or the units a network
    names itself (``hidden_units()``: a residual network's inner block units); ``ValueError`` otherwise."""
    if hasattr(module, "hidden_units"):
        return [HiddenLayer(producer, consumers, 1, True, norms) for producer, consumers,
                norms in module.hidden_units()]
    if isinstance(module, BatchedMLP):
        norms = list(module.norms) if module.norms is not None else []
        consumers = [[layer] for layer in module.layers[1:]] + [list(module.heads)]
        return [
            HiddenLayer(layer, nxt, _inputs(nxt[0]) // _units(layer), True, [norms[i]] if norms else [])
            for i, (layer, nxt) in enumerate(zip(module.layers, consumers))
        ]
    containers = [type(m).__name__ for m in module.modules() if next(m.children(), None) is not None
                  and not isinstance(m, nn.Sequential)]
    if containers:
        raise ValueError(f"redo needs the layer order: a BatchedMLP or an nn.Sequential, got {', '.join(containers)}")
    out: list[HiddenLayer] = []
    producer: nn.Module | None = None
    norms: list[nn.Module] = []
    for name, leaf in module.named_modules():
        if next(leaf.children(), None) is not None:
            continue
        if isinstance(leaf, WEIGHTED):
            if producer is not None:
                h, fin = _units(producer), _inputs(leaf)
                conv = nn.modules.conv._ConvNd
                flattened = isinstance(producer, conv) and not isinstance(leaf, conv)
                if fin != h and not (flattened and fin % h == 0):
                    raise ValueError(f"redo cannot map the {h} units before '{name}' to its {fin} inputs")
                out.append(HiddenLayer(producer, [leaf], fin // h, fin == h, norms))
            producer, norms = leaf, []
        elif isinstance(leaf, NORMS) and producer is not None and getattr(leaf, "weight", None) is not None:
            if _norm_features(leaf) != _units(producer):
                raise ValueError(f"redo: normalization '{name}' does not act on the {_units(producer)} units before it")
            norms.append(leaf)
    return out


@torch.no_grad()
def feature_scores(module: nn.Module, layers: list[HiddenLayer], inputs: Tensor) -> list[Tensor]:
    """Mean |activation| ``[M, in]`` of every input feature of each layer's consumers, from one
    forward of ``inputs`` in eval mode (no BatchNorm statistics are updated)."""
    feats: dict[int, Tensor] = {}
    hooks = [
        layer.consumers[0].register_forward_pre_hook(
            lambda mod, args, i=i: feats.__setitem__(i, layers[i].feature_scores(args[0]))
        )
        for i, layer in enumerate(layers)
    ]
    training = module.training
    try:
        module.eval()
        module(inputs)
    finally:
        module.train(training)
        for hook in hooks:
            hook.remove()
    return [feats[i] for i in range(len(layers))]


def _unit_mask(param: Tensor, layer: nn.Module, units: Tensor, axis: int) -> Tensor:
    """``units [n]`` as a mask broadcast over one member's slice of ``param`` along ``axis``."""
    shape = [1] * member_param(param, layer, 0).dim()
    shape[axis] = -1
    return units.view(shape).expand_as(member_param(param, layer, 0))


@register
class ReDo(Regularizer):
    """Re-initialize dormant hidden units periodically."""

    name = "redo"
    has_penalty = False

    def __init__(self, module: nn.Module, tau: float = 0.1, every: int = 1000, seed: int = 0) -> None:
        super().__init__(module)
        require(0.0 <= tau <= 1.0, f"tau must be in [0, 1], got {tau}")
        require(int(every) >= 1, f"every must be an integer >= 1, got {every}")
        self.tau, self.every = float(tau), int(every)
        members = checked_views(module, "all", self.name)[0].members
        self.layers = hidden_layers(module)
        require(len(self.layers) > 0, "redo: the module has no hidden layer")
        self.seed_default(seed, members)
        device = next(module.parameters()).device
        self.state["dormant_fraction"] = torch.zeros(members, device=device)
        self.state["recycled"] = torch.zeros(members, device=device)

    @torch.no_grad()
    def scores(self) -> list[Tensor]:
        """Normalized scores ``[M, H]`` of every hidden layer on one probe batch."""
        if self.probe is None:
            raise RuntimeError("redo: call set_probe(fn) first; fn() returns a batch of the network's inputs")
        feats = feature_scores(self.module, self.layers, self.probe())
        return [normalized_scores(layer.unit_scores(f)) for layer, f in zip(self.layers, feats)]

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        if step % self.every:
            return
        optimizer = self._require_optimizer()
        dormant = [s <= self.tau for s in self.scores()]
        for layer, mask in zip(self.layers, dormant):
            for m in torch.nonzero(mask.any(dim=1)).flatten().tolist():
                self._recycle(layer, m, mask[m], optimizer)
        units = sum(d.shape[1] for d in dormant)
        counts = sum(d.sum(dim=1) for d in dormant).float()
        self.state["dormant_fraction"].copy_(counts / units)
        self.state["recycled"].add_(counts)

    def _recycle(self, layer: HiddenLayer, m: int, units: Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Re-draw the incoming side of ``units`` of member ``m`` and zero their outgoing weights.

        A member's slice of every parameter is shaped as in a plain torch layer, so a unit is axis 0
        of the producer's weight, bias, gain and shift, and axis 1 of a consumer's weight."""
        for mod in (layer.producer, *layer.norms):
            for param, fresh in zip((mod.weight, getattr(mod, "bias", None)), draw(mod, self.generators[m])):
                if param is None or fresh is None:
                    continue
                mask = _unit_mask(param, mod, units, 0)
                target = member_param(param, mod, m)
                target.copy_(torch.where(mask, fresh.to(target), target))
                zero_moments(optimizer, mod, param, mask, m)
        for consumer in layer.consumers:
            mask = _unit_mask(consumer.weight, consumer, layer.feature_mask(units), 1)
            member_param(consumer.weight, consumer, m).masked_fill_(mask, 0.0)
            zero_moments(optimizer, consumer, consumer.weight, mask, m)

    def metrics(self) -> dict[str, Tensor]:
        return {"dormant_fraction": self.state["dormant_fraction"], "recycled": self.state["recycled"]}
