"""Soft Actor-Critic (Haarnoja et al. 2018) in the jaxrl / primacy-bias form, member-batched.

- Actor: an MLP trunk with separate mean and log-std heads (rl_with_resets' ``NormalTanhPolicy``);
  tanh-Gaussian ``a = tanh(μ + σ·ε)``, log σ squashed into ``[log_std_min, log_std_max]`` by
  ``lo + (hi − lo)·(tanh(x) + 1)/2`` as rl_with_resets does (jaxrl's older policy clips instead);
  log-prob with the exact tanh correction ``log(1 − tanh(u)²) = 2(log 2 − u − softplus(−2u))``.
- Critics: ``num_critics`` Q-networks as members of one :class:`BatchedMLP`; target critics start
  as copies and follow by Polyak averaging (``τ``) after every critic step.
- Initialization (``init: orthogonal``, rl_with_resets' ``default_init``): every linear layer of
  critics and actor orthogonal with gain √2 and zero bias, except the log-std head (gain 1).
- Losses are defined once, per example (as TorchRL's ``reduction="none"``):
  :meth:`SAC.critic_losses` and :meth:`SAC.actor_losses`. The update takes their means; the
  gradient-rank diagnostics differentiate them example by example.
- Critic target ``y = r + γ·(1 − terminated)·(min_j Q̄_j(s′, a′) − α·log π(a′|s′))``: a time-limit
  truncation keeps bootstrapping, only a true termination stops it.
- Order per update (jaxrl): critic step → target update → actor and temperature step (on the
  updated critic, whose parameters are detached so no critic weight gradients are built), with
  ``L(α) = α·(−log π − H̄)``, ``H̄ = −target_entropy_scale·|A|``. Actor and ``log α`` share one
  fused Adam (separate parameter groups and learning rates; the two losses touch disjoint
  parameters, so this equals two separate steps).
- ``precision="bf16"`` runs the networks' matmuls in bf16 on bf16 copies of the weights, re-cast
  once per optimizer step (:mod:`sac_spectral.core.precision`); weights, Adam state, log-probabilities,
  Q-values, targets and losses stay fp32.

``num_seeds`` independent agents train together: the actor has ``N`` members, the critic
``N·num_critics``. Losses are summed over seeds (each seed's gradient is its own) and averaged over
the batch. Regularizers of each network add their penalties to its loss and run their
``after_step`` hooks after its optimizer step.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agents.replay import ReplayBuffer
from sac_spectral.core.config import at_least, check, option, section
from sac_spectral.core.nets import ACTIVATIONS, INITS, BatchedMLP
from sac_spectral.core.precision import Bf16Copies, Bf16Switch
from sac_spectral.core.reinit import reset_layers
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.regularizers import Regularizer, build_regularizers, validate_specs

_LOG2 = math.log(2.0)
_GAIN = math.sqrt(2.0)  # rl_with_resets' default_init: orthogonal with gain √2
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class NetConfig:
    """Architecture, optimizer and regularizers of one network."""

    hidden: list[int] = option([256, 256], "hidden layer widths")
    activation: str = option("relu", f"hidden activation: {', '.join(ACTIVATIONS)}")
    layer_norm: bool = option(False, "LayerNorm after each hidden linear layer")
    init: str = option("orthogonal", "orthogonal (rl_with_resets: gain √2, log-std head 1; zero bias) or torch (nn.Linear default)")
    lr: float = option(3e-4, "Adam learning rate")
    weight_decay: float = option(0.0, "decoupled weight decay (AdamW); 0 = plain Adam")
    regularizers: list[dict[str, Any]] = option([], "regularizers, e.g. [{name: spectral, coef: 1e-4}]")

    def validate(self) -> None:
        check(len(self.hidden) > 0 and all(h > 0 for h in self.hidden), "hidden", f"widths must be positive, got {self.hidden}")
        check(self.activation in ACTIVATIONS, "activation", f"'{self.activation}' is not one of {', '.join(ACTIVATIONS)}")
        check(self.init in INITS, "init", f"'{self.init}' is not one of {', '.join(INITS)}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        at_least(self, 0, "weight_decay")
        validate_specs(self.regularizers, "regularizers")


@dataclass
class ActorConfig(NetConfig):
    log_std_min: float = option(-10.0, "lower bound of the policy's log standard deviation")
    log_std_max: float = option(2.0, "upper bound of the policy's log standard deviation")

    def validate(self) -> None:
        super().validate()
        check(self.log_std_min < self.log_std_max, "log_std_min", f"must be < log_std_max ({self.log_std_max}), got {self.log_std_min}")


@dataclass
class CriticConfig(NetConfig):
    num_critics: int = option(2, "Q-networks in the ensemble (min over them in targets)")

    def validate(self) -> None:
        super().validate()
        at_least(self, 1, "num_critics")


@dataclass
class AlphaConfig:
    init: float = option(1.0, "initial temperature α")
    lr: float = option(3e-4, "temperature learning rate")
    learn: bool = option(True, "learn α toward the target entropy; false keeps it fixed")
    target_entropy_scale: float = option(0.5, "target entropy = −scale·|A| (jaxrl / rl_with_resets: 0.5)")

    def validate(self) -> None:
        check(self.init > 0, "init", f"must be > 0, got {self.init}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")


PRECISIONS = ("fp32", "bf16")


@dataclass
class SACConfig:
    gamma: float = option(0.99, "discount")
    tau: float = option(0.005, "Polyak rate of the target critics (every update)")
    precision: str = option("fp32", "fp32, or bf16 matmuls on bf16 weight copies (fp32 master weights, optimizer state, losses, targets)")
    compile: bool = option(False, "torch.compile the update: losses with their backward, and the optimizer steps (CUDA graphs on GPU)")
    actor: ActorConfig = section(ActorConfig)
    critic: CriticConfig = section(CriticConfig)
    alpha: AlphaConfig = section(AlphaConfig)

    def validate(self) -> None:
        check(0 <= self.gamma <= 1, "gamma", f"must be in [0, 1], got {self.gamma}")
        check(0 < self.tau <= 1, "tau", f"must be in (0, 1], got {self.tau}")
        check(self.precision in PRECISIONS, "precision", f"'{self.precision}' is not one of {', '.join(PRECISIONS)}")


def tanh_gaussian(mean: Tensor, log_std: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """Reparameterized tanh-Gaussian sample and its log-density (summed over action dims)."""
    u = mean + log_std.exp() * noise
    log_prob = (-0.5 * noise.square() - log_std - _HALF_LOG_2PI).sum(-1)
    log_prob = log_prob - (2.0 * (_LOG2 - u - F.softplus(-2.0 * u))).sum(-1)
    return torch.tanh(u), log_prob


def make_actor(
    members: int, obs_dim: int, act_dim: int, cfg: ActorConfig, generators: list[torch.Generator] | None = None
) -> BatchedMLP:
    """The policy network: an MLP trunk with a mean head (gain √2) and a log-std head (gain 1)."""
    return BatchedMLP(
        members, obs_dim, cfg.hidden, (act_dim, act_dim), cfg.activation, cfg.layer_norm, cfg.init,
        out_gains=(_GAIN, 1.0), generators=generators,
    )


def make_critic(
    members: int, obs_dim: int, act_dim: int, cfg: CriticConfig, generators: list[torch.Generator] | None = None
) -> BatchedMLP:
    """``members`` Q-networks of one batched MLP on ``[obs, action]`` (output gain √2)."""
    return BatchedMLP(
        members, obs_dim + act_dim, cfg.hidden, 1, cfg.activation, cfg.layer_norm, cfg.init,
        out_gains=_GAIN, generators=generators,
    )


def actor_mean_log_std(actor: BatchedMLP, obs: Tensor, cfg: ActorConfig) -> tuple[Tensor, Tensor]:
    """Mean and log σ of the pre-tanh Gaussian, log σ squashed into ``[log_std_min, log_std_max]``."""
    mean, raw = actor(obs)
    lo, hi = cfg.log_std_min, cfg.log_std_max
    return mean.float(), lo + 0.5 * (hi - lo) * (torch.tanh(raw.float()) + 1.0)


def _optimizer(groups: list[dict[str, Any]], weight_decay: float, compiled: bool) -> torch.optim.Optimizer:
    """Adam, or AdamW (decoupled decay) when ``weight_decay > 0``; groups carry their lr. Fused
    kernels in eager mode; the multi-tensor form when ``compiled`` (torch.compile fuses it)."""
    kind = {"foreach": True} if compiled else {"fused": True}
    if weight_decay > 0:
        return torch.optim.AdamW(groups, weight_decay=weight_decay, **kind)
    return torch.optim.Adam(groups, **kind)


class SAC(nn.Module):
    """``len(seeds)`` independent SAC agents in member-batched networks."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        cfg: SACConfig,
        streams: SeedStreams,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__()
        self.cfg, self.streams = cfg, streams
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.num_seeds = n = len(streams)
        self.num_critics = c = cfg.critic.num_critics
        self.target_entropy = -cfg.alpha.target_entropy_scale * act_dim
        self.actor = self._build_actor()
        self.critic = self._build_critic()
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.full((n,), math.log(cfg.alpha.init)), requires_grad=cfg.alpha.learn)
        self.to(device)
        actor_groups: list[dict[str, Any]] = [{"params": list(self.actor.parameters()), "lr": cfg.actor.lr}]
        if cfg.alpha.learn:
            actor_groups.append({"params": [self.log_alpha], "lr": cfg.alpha.lr, "weight_decay": 0.0})
        self.actor_opt = _optimizer(actor_groups, cfg.actor.weight_decay, cfg.compile)
        self.critic_opt = _optimizer([{"params": list(self.critic.parameters()), "lr": cfg.critic.lr}], cfg.critic.weight_decay, cfg.compile)
        self.actor_regs, self.critic_regs = self._build_regularizers()
        self.num_updates = 0
        self._members_per_seed = {"actor": 1, "critic": c}
        self._online_params = list(self.critic.parameters())
        self._target_params = list(self.target_critic.parameters())
        self._low_switch: Bf16Switch | contextlib.nullcontext[None] = contextlib.nullcontext()
        self._low: dict[str, Bf16Copies] = {}
        if cfg.precision == "bf16":
            self._low_switch = Bf16Switch()
            self._low = {
                "actor": Bf16Copies(self.actor, self._low_switch, trainable=True),
                "critic": Bf16Copies(self.critic, self._low_switch, trainable=True),
                "target": Bf16Copies(self.target_critic, self._low_switch, trainable=False),
            }
        self._critic_loss = self._critic_loss_eager
        self._actor_loss = self._actor_loss_eager
        self._opt_steps: dict[str, Callable[[], Any]] = {"actor": self.actor_opt.step, "critic": self.critic_opt.step}
        if cfg.compile:
            mode = "reduce-overhead" if self.log_alpha.device.type == "cuda" else None
            self._critic_loss = torch.compile(self._critic_loss_eager, mode=mode, dynamic=False)
            self._actor_loss = torch.compile(self._actor_loss_eager, mode=mode, dynamic=False)
            self._opt_steps = {net: torch.compile(step) for net, step in self._opt_steps.items()}

    # ----------------------------------------------------------------------------- building
    def _build_actor(self) -> BatchedMLP:
        return make_actor(self.num_seeds, self.obs_dim, self.act_dim, self.cfg.actor, self.streams["init"])

    def _critic_generators(self) -> list[torch.Generator]:
        return [g for g in self.streams["init"] for _ in range(self.num_critics)]

    def _build_critic(self) -> BatchedMLP:
        return make_critic(self.num_seeds * self.num_critics, self.obs_dim, self.act_dim, self.cfg.critic,
                           self._critic_generators())

    def _build_regularizers(self) -> tuple[list[Regularizer], list[Regularizer]]:
        """Build each network's regularizers, give them its optimizer and per-member random streams
        seeded from each seed's ``init`` stream (so seed i of a multi-seed run draws what a
        single-seed run draws). Their probe, when they need one, is each update's batch."""
        actor_regs = build_regularizers(self.actor, self.cfg.actor.regularizers, "actor.regularizers")
        critic_regs = build_regularizers(self.critic, self.cfg.critic.regularizers, "critic.regularizers")
        for regs, opt, gens in (
            (actor_regs, self.actor_opt, self.streams["init"]),
            (critic_regs, self.critic_opt, self._critic_generators()),
        ):
            for reg in regs:
                reg.attach(opt)
                if reg.generators:
                    reg.seed_members([int(torch.randint(2**62, (), generator=g)) for g in gens])
        return actor_regs, critic_regs

    # ----------------------------------------------------------------------------- networks
    def policy(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Sample ``a ~ π(·|obs)`` with given standard-normal ``noise``; returns ``(a, log π(a))``."""
        mean, log_std = self._mean_log_std(obs)
        return tanh_gaussian(mean, log_std, noise)

    def _mean_log_std(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return actor_mean_log_std(self.actor, obs, self.cfg.actor)

    def critic_inputs(self, obs: Tensor, action: Tensor) -> Tensor:
        """``[N·num_critics, B, obs+act]``: each seed's ``(obs, action)`` for each of its critics."""
        n, b = obs.shape[:2]
        x = torch.cat([obs, action], dim=-1).unsqueeze(1).expand(n, self.num_critics, b, -1)
        return x.reshape(n * self.num_critics, b, -1)

    def q_values(self, net: BatchedMLP, obs: Tensor, action: Tensor, detach: bool = False) -> Tensor:
        """``[N, num_critics, B]`` Q-values of ``obs, action: [N, B, ·]``."""
        n, b = obs.shape[:2]
        return net(self.critic_inputs(obs, action), detach).float().view(n, self.num_critics, b)

    @torch.inference_mode()
    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Actions ``[N, A]`` for observations ``[N, obs_dim]`` (one per seed)."""
        mean, log_std = self._mean_log_std(obs.unsqueeze(1))
        if deterministic:
            return torch.tanh(mean).squeeze(1)
        noise = self.streams.randn("act", (1, self.act_dim))
        return torch.tanh(mean + log_std.exp() * noise).squeeze(1)  # tanh_gaussian's sample, no log-density

    # ----------------------------------------------------------------------------- losses
    @torch.no_grad()
    def critic_target(self, batch: dict[str, Tensor], noise: Tensor) -> Tensor:
        """``[N, B]`` soft TD target ``r + γ(1 − terminated)(min_j Q̄_j(s′, a′) − α log π(a′|s′))``."""
        next_obs = batch["next_obs"]
        next_action, next_logp = self.policy(next_obs, noise)
        next_q = self.q_values(self.target_critic, next_obs, next_action).amin(dim=1)
        alpha = self.log_alpha.exp().unsqueeze(-1)
        return batch["reward"] + self.cfg.gamma * (1.0 - batch["terminated"]) * (next_q - alpha * next_logp)

    def critic_losses(self, batch: dict[str, Tensor], noise: Tensor) -> tuple[Tensor, Tensor]:
        """Per-example TD losses ``ℓ_{n,j,i} = (Q_{n,j}(s_i, a_i) − y_{n,i})²`` ``[N, C, B]`` with the
        target ``y`` (:meth:`critic_target`, next-state ``noise [N, B, A]``) held fixed, and the
        Q-values ``[N, C, B]``."""
        target = self.critic_target(batch, noise)
        q = self.q_values(self.critic, batch["obs"], batch["action"])
        return (q - target.unsqueeze(1)).square(), q

    def actor_losses(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Per-example actor losses ``ℓ_{n,i} = α_n log π_n(ã_i|s_i) − min_j Q_{n,j}(s_i, ã_i)`` ``[N, B]``
        on critics whose weights are detached (no critic weight gradients are built; α is a
        constant here), with ``ã_i`` reparameterized by ``noise [N, B, A]``, and ``log π`` ``[N, B]``."""
        action, logp = self.policy(obs, noise)
        q_pi = self.q_values(self.critic, obs, action, detach=True).amin(dim=1)
        return self.log_alpha.detach().exp().unsqueeze(-1) * logp - q_pi, logp

    def _critic_loss_eager(self, batch: dict[str, Tensor], noise: Tensor) -> tuple[Tensor, Tensor]:
        """Per-seed critic loss ``Σ_j mean_i ℓ_{n,j,i}`` ``[N]`` and mean Q ``[N]``."""
        with self._low_switch:
            losses, q = self.critic_losses(batch, noise)
        return losses.mean(dim=-1).sum(dim=1), q.detach().mean(dim=(1, 2))

    def _actor_loss_eager(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per-seed actor loss ``mean_i ℓ_{n,i}``, temperature loss ``α(H − H̄)`` and entropy estimate
        ``H = −mean_i log π``, each ``[N]``."""
        with self._low_switch:
            losses, logp = self.actor_losses(obs, noise)
        entropy = -logp.detach().mean(dim=-1)
        return losses.mean(dim=-1), self.log_alpha.exp() * (entropy - self.target_entropy), entropy

    # ----------------------------------------------------------------------------- updates
    def update(self, batch: dict[str, Tensor], noise: Tensor) -> dict[str, Tensor]:
        """One SAC update of every seed; returns its per-seed ``[N]`` metrics (device tensors, no
        host sync). ``batch`` tensors are ``[N, B, ...]``, ``noise`` is ``[2, N, B, A]``
        (next-state actions, current-state actions)."""
        critic_loss, q_mean = self._critic_loss(batch, noise[0])
        self._step("critic", critic_loss.sum(), lambda: self.critic_inputs(batch["obs"], batch["action"]))
        torch._foreach_lerp_(self._target_params, self._online_params, self.cfg.tau)
        if self._low:
            self._low["target"].refresh()

        actor_loss, alpha_loss, entropy = self._actor_loss(batch["obs"], noise[1])
        loss = actor_loss.sum() + alpha_loss.sum() if self.cfg.alpha.learn else actor_loss.sum()
        self._step("actor", loss, lambda: batch["obs"])

        self.num_updates += 1
        return {
            "loss/critic": critic_loss.detach(),
            "loss/actor": actor_loss.detach(),
            "loss/alpha": alpha_loss.detach(),
            "q/mean": q_mean,
            "entropy": entropy,
        }

    def _step(self, net: Literal["actor", "critic"], loss: Tensor, probe: Callable[[], Tensor]) -> None:
        """Add the penalties of ``net``'s regularizers, step its optimizer, then run the
        interventions (which may read ``probe()``, the network's inputs of this update)."""
        opt, regs = (self.actor_opt, self.actor_regs) if net == "actor" else (self.critic_opt, self.critic_regs)
        for reg in regs:
            if reg.has_penalty:
                loss = loss + reg.penalty()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if self._low:
            self._low[net].collect_grads()
        self._opt_steps[net]()
        for reg in regs:
            reg.set_probe(probe)
            reg.after_step(self.num_updates + 1)
        if self._low:
            self._low[net].refresh()

    def train_steps(self, buffer: ReplayBuffer, count: int, batch_size: int) -> dict[str, Tensor]:
        """``count`` updates on fresh uniform batches; indices and noise for all of them are drawn
        at once from each seed's ``sample`` stream. Returns the last update's metrics."""
        idx = buffer.sample_indices(self.streams["sample"], (count, batch_size))
        data = {k: v.transpose(0, 1).contiguous() for k, v in buffer.gather(idx).items()}
        noise = self.streams.randn("sample", (count, 2, batch_size, self.act_dim)).permute(1, 2, 0, 3, 4)
        info: dict[str, Tensor] = {}
        for r in range(count):
            info = self.update({k: v[r] for k, v in data.items()}, noise[r])
        return info

    # ----------------------------------------------------------------------------- resets
    @torch.no_grad()
    def reset(self, what: Literal["all", "last_layers"], last_layers: int = 1) -> None:
        """Nikishin et al. (2022) resets; the replay buffer is kept by the caller.

        ``all`` re-draws actor, critics, targets and α and clears every optimizer state (the
        regularizers are rebuilt); ``last_layers`` re-draws the last ``last_layers`` linear
        layers of actor and critics, copies them into the targets and clears their Adam moments.
        """
        gens, cgens = self.streams["init"], self._critic_generators()
        last = None if what == "all" else last_layers
        reset_layers(self.actor.tail(last), gens, self.actor_opt)
        reset_layers(self.critic.tail(last), cgens, self.critic_opt)
        for src, dst in zip(self.critic.tail(last), self.target_critic.tail(last)):
            dst.load_state_dict(src.state_dict())
        if what == "all":
            self.log_alpha.fill_(math.log(self.cfg.alpha.init))
            self.actor_opt.state.pop(self.log_alpha, None)
            self.actor_regs, self.critic_regs = self._build_regularizers()
        self._refresh_low()

    def _refresh_low(self) -> None:
        """Re-cast the bf16 copies (``precision=bf16``) after the weights were written."""
        for copies in self._low.values():
            copies.refresh()

    # ----------------------------------------------------------------------------- state & metrics
    def metrics(self) -> dict[str, Tensor]:
        """Per-seed ``[N]`` temperature and regularizer metrics (the state, not the last update:
        :meth:`update` returns those)."""
        out = {"alpha": self.log_alpha.detach().exp()}
        for net, regs in (("actor", self.actor_regs), ("critic", self.critic_regs)):
            for reg in regs:
                for key, value in reg.metrics().items():
                    out[f"reg/{net}/{reg.name}/{key}"] = self.per_seed(net, value)
        return out

    def per_seed(self, net: str, value: Tensor) -> Tensor:
        """Average a per-member ``[M]`` value over each seed's members (scalars pass through)."""
        if value.dim() == 0:
            return value
        return value.reshape(self.num_seeds, self._members_per_seed[net]).mean(dim=1)

    def nets(self) -> dict[str, BatchedMLP]:
        return {"actor": self.actor, "critic": self.critic}

    def full_state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, temperature, regularizer state and update count."""
        return {
            "modules": self.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "actor_regs": [r.state_dict() for r in self.actor_regs],
            "critic_regs": [r.state_dict() for r in self.critic_regs],
            "num_updates": self.num_updates,
        }

    def load_full_state_dict(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["modules"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        for reg, s in zip(self.actor_regs, state["actor_regs"], strict=True):
            reg.load_state_dict(s)
        for reg, s in zip(self.critic_regs, state["critic_regs"], strict=True):
            reg.load_state_dict(s)
        self.num_updates = int(state["num_updates"])
        self._refresh_low()
