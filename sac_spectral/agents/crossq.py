"""CrossQ (Bhatt, Palenicek, Belousov, Argus, Amiranashvili, Brox, Peters, "CrossQ: Batch
Normalization in Deep Reinforcement Learning for Greater Sample Efficiency and Simplicity",
ICLR 2024), member-batched, on SAC's actor, policy and temperature
(:mod:`~sac_spectral.agents.networks`).

- **No target networks.** The critics bootstrap from themselves:
  ``y = r + γ(1 − terminated)·(min_j Q_j(s′, a′) − α log π(a′|s′))``, ``a′ ~ π(·|s′)``, held fixed.
- **Batch renormalization in the critic** (Ioffe 2017): on its input and after every hidden
  activation, ``x̂ = (x − μ_B)/σ_B · r + d`` with ``r = clip(σ_B/σ, 1/r_max, r_max)``,
  ``d = clip((μ_B − μ)/σ, −d_max, d_max)`` (no gradient through ``r``, ``d``; ``r = 1, d = 0`` for the
  first ``crossq.warmup`` critic steps: batch normalization), then a gain and a shift. Running
  ``μ, σ²`` move by ``crossq.momentum`` per critic step.
- **One joint forward** of ``(s, a)`` and ``(s′, a′)``: the two batches are concatenated, so the
  batch statistics cover both distributions (the paper's point), and split after.
- The actor steps every ``crossq.policy_delay`` (3) updates on the critics in evaluation mode
  (running statistics), ``L(φ) = mean_i [α log π(ã_i|s_i) − min_j Q_j(s_i, ã_i)]``; the
  temperature as in SAC. Adam with ``β₁ = crossq.adam_beta1`` (0.5) for every network.
- The paper's widths and rates are in ``run_configs/crossq.yaml``: critic 2048-2048, actor
  256-256, learning rates 1e-3, target entropy −|A|.

The critic's per-example losses are those of the joint forward with batch statistics, for its
update and for the gradient-rank diagnostics alike; as batch statistics couple the examples, the
diagnostics differentiate each example's loss through the whole batch's forward (``jacobian``), and
only the update moves the running statistics.

Differences from the authors' code: the actor is SAC's MLP without batch normalization (theirs
normalizes it too).

The critic follows ``critic.hidden``, ``critic.activation`` (ReLU in the paper; one that keeps the
width) and ``critic.init``; another ``critic.arch`` and ``critic.layer_norm: true`` are refused in
one line, as is ``compile: true`` (the running statistics are written inside the forward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from sac_spectral.agents.actor_critic import BETAS, ActorCritic, head_target
from sac_spectral.agents.base import register_agent
from sac_spectral.agents.heads import head_width
from sac_spectral.agents.steps import Metrics, Noise
from sac_spectral.core.config import at_least, check, option
from sac_spectral.core.nets import ACTIVATIONS, BatchedLayerNorm, BatchedLinear, BatchedNetwork
from sac_spectral.core.precision import full
from sac_spectral.core.reinit import per_member
from sac_spectral.core.seeding import SeedStreams

_GAIN = 2.0**0.5


@dataclass
class CrossQConfig:
    """CrossQ's own options (Bhatt et al. 2024; defaults as the authors' code)."""

    policy_delay: int = option(3, "actor and temperature step every N critic updates")
    adam_beta1: float = option(0.5, "Adam's β₁ for every network")
    momentum: float = option(0.01, "rate at which batch renormalization's running statistics move per critic step")
    warmup: int = option(100_000, "critic steps of plain batch normalization (r = 1, d = 0) before renormalization")
    r_max: float = option(3.0, "batch renormalization's bound on r")
    d_max: float = option(5.0, "batch renormalization's bound on d")

    def validate(self) -> None:
        at_least(self, 1, "policy_delay")
        at_least(self, 0, "warmup")
        check(0 <= self.adam_beta1 < 1, "adam_beta1", f"must be in [0, 1), got {self.adam_beta1}")
        check(0 < self.momentum <= 1, "momentum", f"must be in (0, 1], got {self.momentum}")
        check(self.r_max >= 1 and self.d_max >= 0, "r_max",
              f"needs r_max >= 1 and d_max >= 0, got {self.r_max}, {self.d_max}")


class BatchRenorm(BatchedLayerNorm):
    """Batch renormalization over the batch axis of ``[M, B, F]``, per member: gain and shift
    ``[M, F]``, running mean and variance ``[M, F]``. It uses the running statistics unless
    ``batch`` is set (:func:`batch_statistics`), and moves them only when ``update`` is set too
    (:func:`moving_statistics`).
    It computes in fp32 whatever its input (``precision=bf16``: a bf16 layer's output), as the
    other norms keep their parameters, so the running statistics stay fp32."""

    def __init__(self, members: int, features: int, opts: CrossQConfig, eps: float = 1e-3) -> None:
        super().__init__(members, features, eps)
        self.opts, self.batch, self.update = opts, False, False
        self.register_buffer("running_mean", torch.zeros(members, features))
        self.register_buffer("running_var", torch.ones(members, features))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def normalized(self, x: Tensor) -> Tensor:
        """``x`` normalized by the running statistics (what the forward does outside :func:`batch_statistics`)."""
        return (x - self.running_mean.unsqueeze(1)) / (self.running_var.unsqueeze(1) + self.eps).sqrt()

    def forward(self, x: Tensor, detach: bool = False) -> Tensor:
        x = full(x)  # a bf16 layer's output: statistics in fp32, as the running ones
        w, b = (self.weight.detach(), self.bias.detach()) if detach else (self.weight, self.bias)
        if not self.batch:
            return torch.addcmul(b.unsqueeze(1), self.normalized(x), w.unsqueeze(1))
        mean, var = self.running_mean.unsqueeze(1), self.running_var.unsqueeze(1)
        batch_mean, batch_var = x.mean(dim=1, keepdim=True), x.var(dim=1, unbiased=False, keepdim=True)
        batch_std, std = (batch_var + self.eps).sqrt(), (var + self.eps).sqrt()
        o, on = self.opts, self.steps >= self.opts.warmup
        r = torch.where(on, (batch_std.detach() / std).clamp(1 / o.r_max, o.r_max), 1.0)
        d = torch.where(on, ((batch_mean.detach() - mean) / std).clamp(-o.d_max, o.d_max), 0.0)
        if self.update:
            with torch.no_grad():
                self.running_mean.lerp_(batch_mean.squeeze(1), o.momentum)
                self.running_var.lerp_(batch_var.squeeze(1), o.momentum)
                self.steps += 1
        return torch.addcmul(b.unsqueeze(1), (x - batch_mean) / batch_std * r + d, w.unsqueeze(1))


@contextlib.contextmanager
def _renorm_flag(net: nn.Module, flag: str) -> Iterator[None]:
    layers = [m for m in net.modules() if isinstance(m, BatchRenorm)]
    for m in layers:
        setattr(m, flag, True)
    try:
        yield
    finally:
        for m in layers:
            setattr(m, flag, False)


def batch_statistics(net: nn.Module) -> contextlib.AbstractContextManager[None]:
    """Inside: ``net``'s batch renormalization uses batch statistics."""
    return _renorm_flag(net, "batch")


def moving_statistics(net: nn.Module) -> contextlib.AbstractContextManager[None]:
    """Inside: ``net``'s batch renormalization moves its running statistics where it uses batch ones."""
    return _renorm_flag(net, "update")


class RenormMLP(BatchedNetwork):
    """``M`` MLPs ``BRN → [Linear → activation → BRN] × k → Linear`` to ``width`` outputs (``init``:
    orthogonal with gain √2, or torch's); the activation keeps the width (:data:`ACTIVATIONS`'
    multiplier 1)."""

    def __init__(self, members: int, in_dim: int, hidden: list[int], opts: CrossQConfig, activation: str = "relu",
                 init: str = "orthogonal", generators: list[torch.Generator] | None = None, width: int = 1) -> None:
        super().__init__()
        self._act, width_mult = ACTIVATIONS[activation]
        if width_mult != 1:
            raise ValueError(f"batch renormalization keeps each hidden layer's width; '{activation}' changes it")
        gens = per_member(generators, members)
        self.members, self.in_dim, self.out_dims = members, in_dim, (width,)
        self.in_norm = BatchRenorm(members, in_dim, opts)
        dims = [in_dim, *hidden]
        self.layers = nn.ModuleList(BatchedLinear(members, a, b, init=init, gain=_GAIN, generators=gens)
                                    for a, b in zip(dims, hidden))
        self.norms = nn.ModuleList(BatchRenorm(members, h, opts) for h in hidden)
        self.heads = nn.ModuleList([BatchedLinear(members, dims[-1], width, init=init, gain=_GAIN, generators=gens)])

    def output_layers(self) -> list[nn.Module]:
        return list(self.heads)

    def tail(self, last: int | None = None) -> list[nn.Module]:
        levels = [[layer, norm] for layer, norm in zip(self.layers, self.norms)]
        levels[0].insert(0, self.in_norm)
        levels.append(list(self.heads))
        start = 0 if last is None else max(len(levels) - last, 0)
        return [m for level in levels[start:] for m in level]

    def hidden_units(self) -> list[tuple[BatchedLinear, list[BatchedLinear], list[BatchRenorm]]]:
        """Each hidden layer, the layer that reads it and its renormalization (for ReDo and CBP)."""
        consumers = [[layer] for layer in self.layers[1:]] + [list(self.heads)]
        return [(layer, nxt, [norm]) for layer, nxt, norm in zip(self.layers, consumers, self.norms)]

    def forward(self, x: Tensor, detach: bool = False,
                return_hidden: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, -1, -1)
        x = self.in_norm(x, detach)
        hidden = []
        for layer, norm in zip(self.layers, self.norms):
            x = norm(self._act(layer(x, detach)), detach)
            hidden.append(x)
        out = self.heads[0](x, detach)
        return (out, hidden) if return_hidden else out


@register_agent("crossq", config=CrossQConfig)
class CrossQ(ActorCritic):
    """``len(seeds)`` independent CrossQ agents in member-batched networks."""

    sections = ("alpha",)  # SAC's temperature options
    compiles = False
    actor_delay = "crossq.policy_delay"
    targets = ()  # no target networks
    coupled = True

    def __init__(self, obs_dim: int, act_dim: int, cfg: Any, streams: SeedStreams,
                 device: str | torch.device = "cpu") -> None:
        super().__init__(obs_dim, act_dim, cfg, streams, device, betas=(cfg.crossq.adam_beta1, BETAS[1]))

    @classmethod
    def critic_network(cls, members: int, obs_dim: int, act_dim: int, cfg: Any,
                       generators: list[torch.Generator] | None = None) -> BatchedNetwork:
        """The batch-renormalized MLP (:class:`RenormMLP`) on ``critic.hidden``, ``activation`` and ``init``."""
        c = cfg.critic
        return RenormMLP(members, obs_dim + act_dim, list(c.hidden), cfg.crossq, c.activation, c.init, generators,
                         head_width(c))

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """The critic is the batch-renormalized MLP: ``critic.hidden``, ``critic.activation`` (one that
        keeps the width) and ``critic.init`` apply; another ``critic.arch`` or ``critic.layer_norm`` is refused."""
        super().check_config(cfg)
        c = cfg.critic
        check(c.arch == "mlp", "critic.arch",
              f"crossq's critic is its batch-renormalized MLP; '{c.arch}' is not available (use mlp)")
        check(not c.layer_norm, "critic.layer_norm",
              "crossq's critic is normalized by batch renormalization; use false")
        check(ACTIVATIONS[c.activation][1] == 1, "critic.activation",
              f"crossq renormalizes each hidden layer's units; '{c.activation}' changes the width")

    # ----------------------------------------------------------------------------- losses
    def critic_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """Per-example TD losses ``[N, C, B]`` and Q-values of one forward of ``(s, a)`` and
        ``(s′, a′)`` with batch statistics (``a′`` by ``noise["next_action"]``), the target
        ``r + γ(1 − terminated)(min_j Q_j(s′, a′) − α log π(a′|s′))`` held fixed."""
        n, b = batch["obs"].shape[:2]
        with torch.no_grad():
            next_action, next_logp = self.policy(batch["next_obs"], noise["next_action"])
        x = torch.cat([self.critic_inputs(batch["obs"], batch["action"]),
                       self.critic_inputs(batch["next_obs"], next_action)], dim=1)
        with batch_statistics(self.critic):
            both = self.critic(x).view(n, self.num_critics, 2 * b, *self.head.shape)
        out, next_out = both[:, :, :b], both[:, :, b:].detach()
        alpha = self.log_alpha.detach().exp().unsqueeze(-1)
        target = head_target(self.head, batch, next_out, self.cfg.gamma, alpha * next_logp)
        return self.head.losses(out, target), self.head.expectation(out)

    def actor_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """Per-example ``α log π(ã_i|s_i) − min_j Q_j(s_i, ã_i)`` ``[N, B]`` on the critics at their
        running statistics, weights detached, with ``ã_i`` by ``noise["action"]``, and ``log π``."""
        obs = batch["obs"]
        action, logp = self.policy(obs, noise["action"])
        q_pi = self.q_values(self.critic, obs, action, detach=True).amin(dim=1)
        return self.log_alpha.detach().exp().unsqueeze(-1) * logp - q_pi, logp

    # ----------------------------------------------------------------------------- the update
    def critic_step(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Metrics]:
        """The actor-critic's critic step, moving the running statistics."""
        with moving_statistics(self.critic):
            return super().critic_step(batch, noise)

    # ----------------------------------------------------------------------------- resets
    def reset(self, last: int | None = None, networks: Sequence[str] | None = None) -> None:
        """The actor-critic reset (a full one of the actor also resets α and its Adam state); the
        re-drawn renormalization layers restart their running statistics."""
        super().reset(last, networks)
        if "critic" not in self.reset_networks(networks):
            return
        for m in self.critic.tail(last):
            if isinstance(m, BatchRenorm):
                m.running_mean.zero_()
                m.running_var.fill_(1.0)
                m.steps.zero_()

