"""The field's plasticity metrics of an agent's networks during training
(:mod:`sac_spectral.diagnostics.plasticity` defines each one), per seed:

- every log: ``weights/<net>/magnitude`` and ``weights/<net>/distance_from_init`` (from θ₀, the
  networks as built: they are drawn from the seeds, so a resumed run rebuilds the same θ₀);
- one update per log: ``grads/<net>/norm``, ``weights/<net>/effective_lr`` and ``churn/<net>``, the
  change of the network's outputs on a reference batch drawn from the replay buffer with a
  generator of its own (``derive_seed(seed, "churn/<update>")``; the agent's streams are never
  drawn from, so a run trains exactly as one without these metrics);
- at diagnostics: ``features/<net>/stable_rank``, ``features/<net>/norm`` and
  ``active/<net>/fraction`` of the last hidden features (:func:`feature_scalars`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from sac_spectral.agents.base import Agent, Metrics
from sac_spectral.agents.replay import ReplayBuffer, distinct_rows
from sac_spectral.diagnostics.plasticity import ParamSnapshot, UpdateProbe, feature_metrics, weight_metrics

#: transitions in the reference batch of churn
REFERENCE_BATCH = 256


def feature_scalars(agent: Agent, net: str, features: Sequence[Tensor], inputs: Tensor, sigma: Tensor | None,
                    activation: str) -> Metrics:
    """Feature metrics of ``net``'s last hidden ``features`` ``[M, B, F]``; a residual network's
    active units are its last block's inner units (its stream has no activation of its own)."""
    out = feature_metrics(features[-1], net, activation, sigma=sigma)
    module = agent.nets()[net]
    if hasattr(module, "inner_activations"):
        with torch.no_grad():
            inner = module.inner_activations(inputs)
        out[f"active/{net}/fraction"] = feature_metrics(inner[-1], net, activation)[f"active/{net}/fraction"]
    return out


class PlasticityProbes:
    """The training-time plasticity metrics of ``agent`` (seeds ``seeds``)."""

    def __init__(self, agent: Agent, seeds: Sequence[int]) -> None:
        self.agent, self.seeds = agent, list(seeds)
        self.inits = {net: ParamSnapshot(module) for net, module in agent.nets().items()}

    def weights(self) -> Metrics:
        """Per-seed magnitude and distance from θ₀ of every network."""
        out = {}
        for net, module in self.agent.nets().items():
            for tag, value in weight_metrics(module, net, self.inits[net]).items():
                out[tag] = self.agent.per_seed(net, value)
        return out

    def train_steps(self, buffer: ReplayBuffer, count: int, batch_size: int) -> tuple[Metrics, Metrics]:
        """``agent.train_steps`` with the last update measured: its metrics, and the per-seed
        gradient norm, effective learning rate and churn of that update."""
        agent = self.agent
        ref = buffer.gather(distinct_rows(buffer, REFERENCE_BATCH, self.seeds, f"churn/{agent.num_updates + count}")[0])
        probes = {net: UpdateProbe(module, net) for net, module in agent.nets().items()}
        inputs = {net: t.inputs(ref) for net, t in agent.trained.items()}

        def before_last() -> None:
            for net, probe in probes.items():
                probe.before(inputs[net])

        info = agent.train_steps(buffer, count, batch_size, before_last)
        measured = {}
        for net, probe in probes.items():
            for tag, value in probe.after().items():
                measured[tag] = agent.per_seed(net, value)
        return info, measured
