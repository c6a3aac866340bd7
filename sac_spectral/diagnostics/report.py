"""All diagnostics of one network in one call, as TensorBoard-ready tags.

>>> rep = model_diagnostics(model, partial(F.cross_entropy, reduction="none"), x, y)   # doctest: +SKIP
>>> as_floats(rep)                          # {"grad_rank/model/erank": 57.3, …}   # doctest: +SKIP
>>> logger.scalars(rep.scalars, step)       # a RunLogger: one tag per value       # doctest: +SKIP

:func:`network_diagnostics` takes any closure ``loss_fn(module, batch) → [..., B]`` instead (see
:mod:`~sac_spectral.diagnostics.gradients`), e.g. the agents' losses of :mod:`~sac_spectral.agents.probes`.

Scalars (each ``[M]``, one value per member; ``<net>`` is ``name``):

- ``grad_rank/<net>/{erank,cond,frobenius_stable_rank,rank99}``: the per-example gradient matrix of all
  selected parameters; ``grad_rank/<net>/layer<i>/…`` per linear/conv layer (``per_layer``).
- ``spectral/<net>/layer<i>/{sigma_max,sigma_min,cond,erank,frobenius_stable_rank}``: weight spectra.
- ``features/<net>/layer<i>/erank`` per hidden layer and ``features/<net>/erank`` (the last hidden
  layer, the features the output layer reads).
- ``dormant/<net>/fraction`` (ReDo score ≤ ``tau``) and ``dormant/<net>/fraction_tau0`` (score 0)
  over all hidden units, ``dormant/<net>/layer<i>/fraction`` per layer.

Histograms (``[M, k]``): ``spectra/<net>/layer<i>`` (weight singular values) and
``spectra/<net>/grad`` (singular values of the gradient matrix).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from sac_spectral.diagnostics.features import (
    dormant_fraction,
    dormant_scores,
    feature_spectrum,
    hidden_activations,
)
from sac_spectral.diagnostics.gradients import ALL, LossFn, Method, gradient_spectra
from sac_spectral.diagnostics.metrics import DEFAULT_RTOL
from sac_spectral.diagnostics.spectra import weight_spectra

GRAD_KEYS = ("erank", "cond", "frobenius_stable_rank", "rank99")
WEIGHT_KEYS = ("sigma_max", "sigma_min", "cond", "erank", "frobenius_stable_rank")


@dataclass
class Report:
    """Tag → per-member values: ``scalars`` ``[M]``, ``histograms`` ``[M, k]``."""

    scalars: dict[str, Tensor] = field(default_factory=dict)
    histograms: dict[str, Tensor] = field(default_factory=dict)


def feature_report(features: Sequence[Tensor], name: str, tau: float, rtol: float = DEFAULT_RTOL) -> Report:
    """Feature erank and dormant fractions of hidden activations ``[M, B, F]`` or ``[B, F]`` (one per layer)."""
    rep = Report()
    dormant, silent, units = 0.0, 0.0, 0
    for i, h in enumerate(features):
        h = h if h.dim() > 2 else h.unsqueeze(0)
        _, summary = feature_spectrum(h, rtol)
        rep.scalars[f"features/{name}/layer{i}/erank"] = summary["erank"]
        frac = dormant_fraction(h, tau)
        rep.scalars[f"dormant/{name}/layer{i}/fraction"] = frac
        width = h.shape[-1]
        dormant = dormant + frac * width
        silent = silent + (dormant_scores(h) <= 0).to(h.dtype).sum(dim=-1)
        units += width
    if features:
        rep.scalars[f"features/{name}/erank"] = rep.scalars[f"features/{name}/layer{len(features) - 1}/erank"]
        rep.scalars[f"dormant/{name}/fraction"] = dormant / units
        rep.scalars[f"dormant/{name}/fraction_tau0"] = silent / units
    return rep


def network_diagnostics(
    module: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    name: str,
    features: Sequence[Tensor] = (),
    tau: float = 0.1,
    example_dim: int = 0,
    method: Method = "auto",
    rtol: float = DEFAULT_RTOL,
    per_layer: bool = True,
    params: Sequence[str] | None = None,
) -> Report:
    """Gradient rank of ``loss_fn`` on ``batch``, weight spectra of ``module``, and feature
    statistics of ``features`` (e.g. :func:`~sac_spectral.diagnostics.features.hidden_activations`)."""
    rep = feature_report(features, name, tau, rtol)
    for group, (sigma, summary) in gradient_spectra(module, loss_fn, batch, params, example_dim, method, rtol).items():
        if group != ALL and not per_layer:
            continue
        prefix = f"grad_rank/{name}" if group == ALL else f"grad_rank/{name}/{group}"
        rep.scalars.update({f"{prefix}/{k}": summary[k] for k in GRAD_KEYS})
        if group == ALL:
            rep.histograms[f"spectra/{name}/grad"] = sigma
    for i, (sigma, summary) in enumerate(weight_spectra(module, rtol)):
        rep.scalars.update({f"spectral/{name}/layer{i}/{k}": summary[k] for k in WEIGHT_KEYS})
        rep.histograms[f"spectra/{name}/layer{i}"] = sigma
    return rep


def model_diagnostics(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    inputs: Tensor,
    targets: Tensor,
    name: str = "model",
    tau: float = 0.025,
    **kwargs: Any,
) -> Report:
    """:func:`network_diagnostics` of a supervised ``model`` on probe ``inputs [B, ...]`` and
    ``targets [B, ...]``: ``loss_fn(model(inputs), targets)`` must return per-example losses
    (``reduction="none"``); features from :func:`~sac_spectral.diagnostics.features.hidden_activations`."""
    return network_diagnostics(
        model, lambda m, b: loss_fn(m(b[0]), b[1]), (inputs, targets), name,
        hidden_activations(model, inputs), tau, **kwargs,
    )


def as_floats(rep: Report) -> dict[str, float | list[float]]:
    """Plain numbers for printing or JSON: a float for one member, else a list per member."""
    out: dict[str, float | list[float]] = {}
    for tag, value in rep.scalars.items():
        vals = value.detach().float().reshape(-1).tolist()
        out[tag] = vals[0] if len(vals) == 1 else vals
    return out

