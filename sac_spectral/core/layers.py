"""Uniform per-member views of a network's parameterized layers.

Regularizers and diagnostics treat every layer the same way: a weight as a batch of matrices
``[M, rows, cols]`` (one per member) and a bias, gain or shift as ``[M, n]``. The views share
storage with the parameters and are differentiable, so a penalty computed on them reaches the
parameters' gradients.

- ``nn.Linear``: weight ``[out, in]`` → ``[1, out, in]`` (a plain layer is one member).
- :class:`~sac_spectral.core.nets.BatchedLinear`: weight ``[M, out, in]`` as stored.
- ``nn.Conv1d/2d/3d``: kernel ``[out, in, *k]`` reshaped to ``[1, out, in·∏k]``.
- ``nn.LayerNorm`` / :class:`~sac_spectral.core.nets.BatchedLayerNorm`: ``kind="norm"``, gain and shift;
  SimbaV2's :class:`~sac_spectral.core.hyperspherical.BatchedScaler`: ``kind="norm"``, a gain alone.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

from torch import Tensor, nn

from sac_spectral.core.hyperspherical import BatchedScaler
from sac_spectral.core.nets import BatchedLayerNorm, BatchedLinear, BatchedNetwork
from sac_spectral.core.reinit import TORCH_NORMS, member_count, members_view

Kind = Literal["linear", "conv", "norm"]
#: the layers with a weight matrix (kernel): linear, member-batched linear, convolutions
WEIGHTED = (nn.Linear, nn.modules.conv._ConvNd, BatchedLinear)
#: the normalization layers (gain and shift; SimbaV2's scalers are a gain alone)
NORMS = (*TORCH_NORMS, BatchedLayerNorm, BatchedScaler)
LAYER_CHOICES = ("all", "hidden")


@dataclass(frozen=True)
class LayerView:
    """One parameterized layer: ``name`` in the module tree, its ``kind`` and member count."""

    name: str
    module: nn.Module
    kind: Kind
    members: int
    is_output: bool

    @property
    def weight_param(self) -> nn.Parameter | None:
        return getattr(self.module, "weight", None)

    @property
    def bias_param(self) -> nn.Parameter | None:
        return getattr(self.module, "bias", None)

    def weight_of(self, w: Tensor) -> Tensor:
        """A value of the weight parameter as ``[M, rows, cols]`` (linear, conv) or ``[M, n]`` (norm gain)."""
        return members_view(w, self.module).flatten(1 if self.kind == "norm" else 2)

    def bias_of(self, b: Tensor) -> Tensor:
        """A value of the bias (or norm shift) parameter as ``[M, n]``."""
        return members_view(b, self.module).flatten(1)

    def weight(self) -> Tensor | None:
        """Weight as ``[M, rows, cols]`` (linear, conv) or gain as ``[M, n]`` (norm)."""
        w = self.weight_param
        return None if w is None else self.weight_of(w)

    def bias(self) -> Tensor | None:
        """Bias (or norm shift) as ``[M, n]``."""
        b = self.bias_param
        return None if b is None else self.bias_of(b)

    def params(self) -> list[nn.Parameter]:
        """The layer's parameters as stored: weight (or gain), then bias (or shift)."""
        return [t for t in (self.weight_param, self.bias_param) if t is not None]

    def tensors(self) -> list[Tensor]:
        """The layer's parameters with the member axis first: weight (or gain), then bias (or shift)."""
        return [t for t in (self.weight(), self.bias()) if t is not None]


def _classify(module: nn.Module) -> tuple[Kind, int] | None:
    if isinstance(module, (nn.Linear, BatchedLinear)):
        return "linear", member_count(module)
    if isinstance(module, nn.modules.conv._ConvNd):
        return "conv", 1
    if isinstance(module, NORMS):
        if getattr(module, "weight", None) is None and getattr(module, "bias", None) is None:
            return None
        return "norm", member_count(module)
    return None


def layer_views(module: nn.Module, layers: str = "all") -> list[LayerView]:
    """Views of every parameterized layer of ``module`` in registration order.

    ``layers="hidden"`` drops the output layers: those ``module.output_layers()`` lists (a
    :class:`~sac_spectral.core.nets.BatchedMLP`'s heads), otherwise the last linear or conv layer.
    """
    if layers not in LAYER_CHOICES:
        raise ValueError(f"layers must be one of {', '.join(LAYER_CHOICES)}, got '{layers}'")
    found = [(name, m, c) for name, m in module.named_modules() if (c := _classify(m)) is not None]
    if hasattr(module, "output_layers"):
        outputs = {id(m) for m in module.output_layers()}
    else:
        weighted = [m for _, m, c in found if c[0] != "norm"]
        outputs = {id(weighted[-1])} if weighted else set()
    views = [LayerView(name or type(m).__name__, m, c[0], c[1], id(m) in outputs) for name, m, c in found]
    if layers == "hidden":
        views = [v for v in views if not v.is_output]
    return views


def view_names(views: list[LayerView]) -> list[str]:
    """Log names of ``views``: ``layer<i>`` numbers the linear/conv layers in order (as the weight
    spectra and ``spectral/<net>/layer<i>`` tags do), ``norm<i>`` the normalization layers."""
    counts = {"layer": 0, "norm": 0}
    names = []
    for view in views:
        kind = "norm" if view.kind == "norm" else "layer"
        names.append(f"{kind}{counts[kind]}")
        counts[kind] += 1
    return names


SUPPORTED = ("nn.Linear, nn.Conv1d/2d/3d, nn.LayerNorm/GroupNorm/BatchNorm and sac_spectral's "
             "BatchedLinear/BatchedLayerNorm")


def checked_views(module: nn.Module, layers: str, method: str) -> list[LayerView]:
    """:func:`layer_views` for regularizer ``method``; raises ``ValueError`` if the module has a
    layer no view covers (e.g. ``nn.Embedding``), has no layer at all, or mixes member counts, and
    warns about loose parameters owned by containers (e.g. a ViT's class token), which it skips."""
    if layers not in LAYER_CHOICES:
        raise ValueError(f"layers must be one of {', '.join(LAYER_CHOICES)}, got '{layers}'")
    owners = {name or type(m).__name__: m for name, m in module.named_modules()}
    bad = unsupported_layers(module)
    layers_ = [n for n in bad if not any(True for _ in owners[n].children())]
    if layers_:
        raise ValueError(f"{method} cannot handle the parameters of {', '.join(layers_)}; "
                         f"supported layers: {SUPPORTED}")
    loose = [n for n in bad if n not in layers_]
    if loose:
        warnings.warn(
            f"{method} leaves the loose parameters of {', '.join(loose)} (tokens, position embeddings, …) "
            "alone: they belong to no layer", stacklevel=3,
        )
    views = layer_views(module, layers)
    if not views:
        raise ValueError(f"{method}: the module has no layer to act on (supported: {SUPPORTED})")
    counts = sorted({v.members for v in views})
    if len(counts) > 1:
        raise ValueError(f"{method}: layers have different member counts {counts}; use one member-batched network")
    return views


def layer_tail(module: nn.Module, last: int | None = None) -> list[nn.Module]:
    """The modules of the last ``last`` linear/conv layers and the normalization layers after them
    (every layer if ``None``). A :class:`~sac_spectral.core.nets.BatchedNetwork` knows its order; other
    modules are taken in registration order."""
    if isinstance(module, BatchedNetwork):
        return module.tail(last)
    views = layer_views(module)
    weighted = [i for i, v in enumerate(views) if v.kind != "norm"]
    start = 0 if last is None or last >= len(weighted) else weighted[-last]
    return [v.module for v in views[start:]]


def unsupported_layers(module: nn.Module) -> list[str]:
    """Names of leaf modules that own parameters but have no view (e.g. embeddings)."""
    out = []
    for name, m in module.named_modules():
        if _classify(m) is None and any(True for _ in m.parameters(recurse=False)):
            out.append(name or type(m).__name__)
    return out
