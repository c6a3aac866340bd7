"""What an actor-critic run of a config would silently skip, and what its memory holds: the checks
and the estimate behind :meth:`~sac_spectral.agents.actor_critic.ActorCritic.run_warnings` and
:meth:`~sac_spectral.agents.actor_critic.ActorCritic.memory_estimate`."""

from __future__ import annotations

import math
from typing import Any

from sac_spectral.agents.heads import loss_elements
from sac_spectral.core.nets import BatchedNetwork
from sac_spectral.core.sizes import ADAM_COPIES, FLOAT32
from sac_spectral.regularizers import acts_at, parameter_copies


def regularizer_warnings(cfg: Any) -> list[str]:
    """An intervention whose ``at_step`` lies beyond the run's ``cfg.total_updates`` updates, and a
    spectral penalty on a categorical head's logits (which failed to learn the quick task: docs/agents.md)."""
    updates, out = cfg.total_updates, []
    for net in ("actor", "critic"):
        for i, spec in enumerate(getattr(cfg, net).regularizers):
            at = acts_at(spec)
            if updates and at is not None and at > updates:
                out.append(f"{net}.regularizers[{i}] ({spec['name']}): at_step={at} lies beyond the run's "
                           f"{updates} updates: it never acts")
    if cfg.critic.head == "categorical" and any(spec["name"] == "spectral" and spec.get("layers", "all") == "all"
                                                for spec in cfg.critic.regularizers):
        out.append("critic.regularizers: spectral holds the categorical head's output layer (its logits) near "
                   "σ_max 1; on the quick task that failed to learn (docs/agents.md): consider layers: hidden "
                   "or no critic regularizer")
    return out


def memory_parts(cfg: Any, nets: dict[str, BatchedNetwork], obs_dim: int, act_dim: int) -> dict[str, float]:
    """Bytes of a run: the replay buffer, the networks ``nets`` (built on the meta device; trained ones
    with gradients, Adam moments and their regularizers' parameter copies, ``target_*`` ones once), one
    step's batches and a batch's activations (each hidden unit keeps its pre- and post-activation for
    backward and gets a gradient of each), and the diagnostics' per-example gradients."""
    n, c, b = cfg.num_seeds, cfg.critic.num_critics, cfg.batch_size
    transition = 2 * obs_dim + act_dim + 2
    counts = {k: sum(p.numel() for p in net.parameters()) for k, net in nets.items()}
    networks = sum(v * (ADAM_COPIES + parameter_copies(getattr(cfg, k).regularizers)) if not k.startswith("target")
                   else v for k, v in counts.items())
    critic_sizes = [obs_dim + act_dim, *cfg.critic.hidden, sum(nets["critic"].out_dims)]
    actor_sizes = [obs_dim, *cfg.actor.hidden, sum(nets["actor"].out_dims)]
    parts = {
        "replay buffer": FLOAT32 * n * cfg.buffer_size * transition,
        "networks and Adam state": FLOAT32 * networks,
        "a batch's transitions and activations": FLOAT32 * (
            math.ceil(cfg.replay_ratio) * n * b * transition
            + 2 * n * c * b * (critic_sizes[0] + 4 * sum(critic_sizes[1:]))
            + 2 * n * b * (actor_sizes[0] + 4 * sum(actor_sizes[1:]))
        ),
    }
    if cfg.critic.head != "scalar":
        parts["critic head's target and loss"] = FLOAT32 * n * b * loss_elements(cfg.critic)
    if cfg.diagnostics.every:
        per_member = max(counts["critic"] // (n * c), counts["actor"] // n)
        parts["diagnostics probe"] = FLOAT32 * n * c * min(cfg.diagnostics.batch_size, cfg.buffer_size) * per_member
    return parts
