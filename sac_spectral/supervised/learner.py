"""The continual learner: one model, its optimizer and regularizers, trained without task labels.

Each update adds every regularizer's ``penalty()`` to the mean task loss, steps the optimizer and
calls ``after_step(update)``. Losses: cross-entropy for classification, ``½‖f(x) − y‖²`` (summed
over outputs, averaged over the batch) for regression.

Diagnostics plug in as functions of a :class:`Probe` — the model, a fixed batch of the current
task and the per-example loss function — returning ``{tag: value}``. The runner calls
:meth:`ContinualLearner.diagnose` at the end of every task and every ``diagnostics_every``
iterations; :func:`weight_sigma_max` (σ_max of every layer) is the light one,
:func:`plasticity_diagnostics` adds gradient rank, feature rank and dormant units. A diagnostic
that fails never stops training: its values are logged as NaN and a warning is printed once.

Interventions that need activation statistics (ReDo) get the current training batch as probe.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sac_spectral.diagnostics import layer_sigma_max
from sac_spectral.diagnostics.report import model_diagnostics
from sac_spectral.regularizers import Regularizer, regularized_step

LossFn = Callable[[Tensor, Tensor], Tensor]


def classification_loss(out: Tensor, y: Tensor) -> Tensor:
    """Per-example cross-entropy ``[B]``."""
    return F.cross_entropy(out, y, reduction="none")


def regression_loss(out: Tensor, y: Tensor) -> Tensor:
    """Per-example ``½‖out − y‖²`` ``[B]``."""
    return 0.5 * (out - y).square().sum(dim=-1)


LOSS_FNS: dict[str, LossFn] = {"classification": classification_loss, "regression": regression_loss}


@dataclass(frozen=True)
class Probe:
    """What a diagnostic sees. ``loss_fn(model(x), y)`` gives per-example losses ``[B]`` (so
    per-example gradients can be formed, e.g. with ``torch.func``)."""

    model: nn.Module
    x: Tensor
    y: Tensor
    loss_fn: LossFn
    task: int
    iteration: int
    task_end: bool


Diagnostic = Callable[[Probe], Mapping[str, Tensor | float]]


def weight_sigma_max(probe: Probe) -> dict[str, Tensor]:
    """Exact σ_max of every linear and conv layer, as ``spectral/model/layer<i>/sigma_max``."""
    return {f"spectral/model/layer{i}/sigma_max": s[0] for i, s in enumerate(layer_sigma_max(probe.model))}


def plasticity_diagnostics(tau: float) -> Diagnostic:
    """Per-example gradient rank and condition number, weight spectra, feature rank and dormant
    fraction (ReDo score ≤ ``tau``, and = 0) of the model on the probe batch."""

    def diagnostic(probe: Probe) -> dict[str, Tensor]:
        report = model_diagnostics(probe.model, probe.loss_fn, probe.x, probe.y, "model", tau)
        return {tag: value.reshape(-1)[0] for tag, value in report.scalars.items()}

    return diagnostic


class ContinualLearner:
    """Model + optimizer + regularizers; no notion of task boundaries."""

    def __init__(
        self,
        model: nn.Module,
        objective: str,
        optimizer: torch.optim.Optimizer,
        regularizers: Sequence[Regularizer] = (),
        diagnostics: Sequence[Diagnostic] = (weight_sigma_max,),
    ) -> None:
        if objective not in LOSS_FNS:
            raise ValueError(f"objective must be one of {', '.join(LOSS_FNS)}, got '{objective}'")
        self.model, self.objective, self.optimizer = model, objective, optimizer
        self.loss_fn = LOSS_FNS[objective]
        self.regularizers = list(regularizers)
        self._batch: Tensor | None = None
        for reg in self.regularizers:
            reg.attach(optimizer)
            reg.set_probe(self._probe)
        self.diagnostics = list(diagnostics)
        self._tags: dict[int, list[str]] = {}
        self._warned: set[tuple[int, str]] = set()
        self.updates = 0

    def _probe(self) -> Tensor:
        """The inputs of the current training batch (what ReDo scores units on)."""
        if self._batch is None:
            raise RuntimeError("no training batch yet: the probe is read during train_step")
        return self._batch

    def train_step(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """One update on ``(x, y)``; returns the detached mean task loss and the number of
        correctly classified examples (0 for regression), without a host sync."""
        self.model.train()
        self._batch = x
        out = self.model(x)
        task_loss = self.loss_fn(out, y).mean()
        self.updates += 1
        regularized_step(task_loss, self.optimizer, self.regularizers, self.updates)
        if self.objective == "classification":
            correct = (out.argmax(dim=-1) == y).sum()
        else:
            correct = torch.zeros((), dtype=torch.long, device=out.device)
        return task_loss.detach(), correct.detach()

    @torch.no_grad()
    def evaluate(self, batches: Iterable[tuple[Tensor, Tensor]]) -> dict[str, float] | None:
        """Mean loss and (for classification) accuracy over ``batches``; ``None`` if there are none."""
        self.model.eval()
        total, correct, count = 0.0, 0, 0
        for x, y in batches:
            out = self.model(x)
            total += float(self.loss_fn(out, y).sum())
            if self.objective == "classification":
                correct += int((out.argmax(dim=-1) == y).sum())
            count += len(y)
        if count == 0:
            return None
        result = {"loss": total / count}
        if self.objective == "classification":
            result["acc"] = correct / count
        return result

    def diagnose(self, x: Tensor, y: Tensor, task: int, iteration: int, task_end: bool) -> dict[str, float]:
        """Run every diagnostic on the probe batch ``(x, y)``; ``{tag: value}`` for logging. A
        diagnostic that raises gives NaN for the tags it gave before, with a one-time warning."""
        self.model.eval()
        probe = Probe(self.model, x, y, self.loss_fn, task, iteration, task_end)
        out: dict[str, float] = {}
        for i, diagnostic in enumerate(self.diagnostics):
            try:
                values = {k: float(v.detach()) if isinstance(v, Tensor) else float(v) for k,
                          v in diagnostic(probe).items()}
            except Exception as err:  # noqa: BLE001 - a measurement must never stop training
                kind = type(err).__name__.lstrip("_")
                if (i, kind) not in self._warned:
                    self._warned.add((i, kind))
                    name = getattr(diagnostic, "__name__", "diagnostic")
                    first = (str(err).strip().splitlines() or [""])[0][:160]
                    print(f"warning: {name} failed at iteration {iteration} ({kind}: {first}); "
                          "its values are logged as NaN", file=sys.stderr)
                values = {tag: math.nan for tag in self._tags.get(i, [])}
            else:
                self._tags[i] = list(values)
            out.update(values)
        return out

    def metrics(self) -> dict[str, Tensor]:
        """Regularizer metrics as ``reg/model/<name>/<key>`` (one value: the model has one member)."""
        out = {}
        for reg in self.regularizers:
            for key, value in reg.metrics().items():
                out[f"reg/model/{reg.name}/{key}"] = value.detach().float().mean()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "regularizers": [r.state_dict() for r in self.regularizers],
            "updates": self.updates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for reg, s in zip(self.regularizers, state["regularizers"], strict=True):
            reg.load_state_dict(s)
        self.updates = int(state["updates"])
