"""Diagnostics of an agent's trained networks: their losses as per-example closures, a probe
batch, the config section.

The losses are each network's own per-example losses as the agent declares them in its table
(:attr:`~sac_spectral.agents.engine.Trained.losses`: for the actor-critic agents the TD loss of
every critic member, target held fixed — REDQ's on its update's random subset, CrossQ's in its
joint forward with batch statistics — and SAC's ``α log π − min Q``, TD3's ``−Q_1``, on detached
critics), with the noise an update draws, so the diagnostics differentiate exactly what the update
minimizes (it takes their means). Where the losses couple the examples (``Trained.coupled``:
CrossQ's batch statistics) the gradients are the ``jacobian`` method's, each example's loss
through the whole batch's forward.

The probe batch and its noise come from generators seeded by ``derive_seed(seed, "diagnostics/<k>")``
for the ``k``-th update count: the agent's own random streams and the global torch generator are
never drawn from, so a run with diagnostics trains exactly as one without. Nothing here changes
the agent (no optimizer step, no power iteration, no ``.grad`` written).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from sac_spectral.agents.plasticity import feature_scalars
from sac_spectral.agents.replay import distinct_rows
from sac_spectral.agents.steps import Noise, draw_shapes, draw_size, per_example, split_draws
from sac_spectral.core.config import at_least, check, option
from sac_spectral.diagnostics.gradients import METHODS, LossFn
from sac_spectral.diagnostics.metrics import DEFAULT_RTOL
from sac_spectral.diagnostics.report import Report, network_diagnostics

if TYPE_CHECKING:
    from sac_spectral.agents.base import Agent
    from sac_spectral.agents.replay import ReplayBuffer

DEFAULT_EVERY = 1000


@dataclass
class DiagnosticsConfig:
    every: int = option(DEFAULT_EVERY,
                        "gradient-rank, spectra, feature and dormant diagnostics before the first update and every N "
                        "updates (0 = off)")
    batch_size: int = option(256, "replay transitions in the probe batch (rows of the per-example gradient matrix)")
    tau: float = option(0.1, "ReDo dormant-score threshold for dormant/<net>/fraction (τ = 0 is logged too)")
    rtol: float = option(DEFAULT_RTOL, "condition-number floor: singular values <= rtol·σ_max are ignored")
    per_layer: bool = option(True, "also log the gradient rank of every layer")
    histograms: bool = option(True, "singular-value histograms under spectra/")
    method: str = option("auto", f"per-example gradient Gram: {' | '.join(METHODS)}")
    q_scale: int = option(0, "episodes per seed of the value scale (the critics' mean Q on the policy's evaluation "
                             "states against their discounted Monte-Carlo return) at every task switch and at the "
                             "end of the run (0 = off)")

    def validate(self) -> None:
        check(self.every >= 0, "every", f"must be >= 0 (0 = off), got {self.every}")
        check(self.batch_size >= 2, "batch_size", f"must be >= 2, got {self.batch_size}")
        at_least(self, 0, "tau")
        check(self.q_scale >= 0, "q_scale", f"must be >= 0 episodes (0 = off), got {self.q_scale}")
        check(0 < self.rtol < 1, "rtol", f"must be in (0, 1), got {self.rtol}")
        check(self.method in METHODS, "method", f"'{self.method}' is not one of {', '.join(METHODS)}")


def probe_batch(
    agent: Agent, buffer: ReplayBuffer, batch_size: int, seeds: Sequence[int], tick: int
) -> tuple[dict[str, Tensor], Noise]:
    """``[N, B, ...]`` distinct transitions (``B = min(batch_size, len(buffer))``, drawn without
    replacement so that no row of the gradient matrix repeats) and the noise an update on them
    draws (:attr:`~sac_spectral.agents.engine.Engine.draws`, each ``[N, *shape]``), from
    generators of their own."""
    if len(buffer) == 0:
        raise RuntimeError("cannot draw a probe batch from an empty replay buffer")
    idx, gens = distinct_rows(buffer, batch_size, seeds, f"diagnostics/{tick}")
    shapes = draw_shapes(agent.draws, idx.shape[1])
    flat = torch.stack([torch.randn((draw_size(shapes),), generator=g, device=g.device) for g in gens])
    return buffer.gather(idx), split_draws(flat, shapes)


def network_loss(agent: Agent, net: str, batch: dict[str, Tensor], noise: Noise) -> tuple[LossFn, dict[str, Tensor]]:
    """Closure ``(module, probe) → [M, B]``: network ``net``'s per-example losses as the agent
    declares them (:attr:`~sac_spectral.agents.engine.Trained.losses`, with the update's named
    ``noise``), and its probe: the batch with the per-example draws (``noise/<name>``), every tensor
    ``[N, B, ·]``; the draws of the whole batch (REDQ's subset) are the closure's."""
    examples = per_example(agent.draws)
    probe = {**batch, **{f"noise/{name}": noise[name] for name in examples}}
    shared = {name: v for name, v in noise.items() if name not in examples}
    losses = agent.trained[net].losses

    def loss(module: nn.Module, b: dict[str, Tensor]) -> Tensor:
        return losses(b, {**{name: b[f"noise/{name}"] for name in examples}, **shared})

    return loss, probe


@torch.no_grad()
def hidden_features(agent: Agent, batch: dict[str, Tensor]) -> dict[str, list[Tensor]]:
    """Post-activation hidden features ``[M, B, F]`` of every trained network on its inputs."""
    return {net: list(t.module(t.inputs(batch), return_hidden=True)[1]) for net, t in agent.trained.items()}


def agent_diagnostics(agent: Agent, batch: dict[str, Tensor], noise: Noise,
                      cfg: DiagnosticsConfig) -> dict[str, Report]:
    """``{net: Report}`` for every trained network with per-example losses, on a probe ``batch``
    ``[N, B, ...]`` with its named ``noise``; values are per member."""
    features = hidden_features(agent, batch)
    out = {}
    for net, t in agent.trained.items():
        if t.losses is None:
            continue
        loss, probe = network_loss(agent, net, batch, noise)
        method = "jacobian" if t.coupled else cfg.method
        rep = network_diagnostics(t.module, loss, probe, net, features[net], cfg.tau, example_dim=1, method=method,
                                  rtol=cfg.rtol, per_layer=cfg.per_layer)
        rep.scalars.update(feature_scalars(agent, net, features[net], t.inputs(batch), None, t.cfg.activation))
        if not cfg.histograms:
            rep.histograms.clear()
        out[net] = rep
    return out
