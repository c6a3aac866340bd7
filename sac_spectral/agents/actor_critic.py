"""The one small base of the member-batched actor-critic agents (SAC, TD3, REDQ, DroQ, CrossQ) on
the update engine, and the pieces they share as functions: an actor with one member per seed and
``num_critics`` Q-networks per seed in one batched critic, the critic's input layout, head outputs and
Q-values (their expectations, :mod:`~sac_spectral.agents.heads`), the TD target of any head and the
critic step's reduction, the table of trained networks, acting, the run checks and the memory
estimate.

:class:`ActorCritic` holds the plan they share, defined once: build the networks (SAC's tanh-Gaussian
actor and critics by default) and the targets the agent names, SAC's temperature for a soft actor,
then every update the critic step and, every ``actor_delay``-th update, the actor step, the targets
moving by Polyak averaging after the step the agent names. Each agent writes in its own file, one
level below :class:`ActorCritic`, what differs: its draws, losses and target, its networks where
they are not SAC's, and its config.

Seed ``n``'s critics are members ``n·C … n·C + C − 1`` of the critic.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from sac_spectral.agents.base import actor_dims
from sac_spectral.agents.engine import Engine, Trained
from sac_spectral.agents.heads import Head, head_width, make_head
from sac_spectral.agents.networks import (
    actor_groups,
    actor_mean_log_std,
    make_actor,
    make_critic,
    reset_temperature,
    soft_actor_step,
    tanh_gaussian,
    tanh_gaussian_actions,
    temperature,
)
from sac_spectral.agents.run_checks import memory_parts, regularizer_warnings
from sac_spectral.agents.steps import BATCH, Metrics, NetStep, Noise
from sac_spectral.core.nets import BatchedNetwork
from sac_spectral.core.optim import make_optimizer
from sac_spectral.core.precision import full
from sac_spectral.core.seeding import SeedStreams

#: Adam's default ``(β₁, β₂)``
BETAS = (0.9, 0.999)
Acting = Callable[[BatchedNetwork, Tensor, "Tensor | None"], Tensor]


def member_generators(streams: SeedStreams | None, members: int) -> list[torch.Generator] | None:
    """Each of ``members`` per seed's ``init`` stream (``None`` without streams: torch's global one)."""
    return None if streams is None else [g for g in streams["init"] for _ in range(members)]


def make_optimizer_of(cfg: Any, params: list[nn.Parameter] | list[dict[str, Any]],
                      betas: tuple[float, float] = BETAS) -> torch.optim.Optimizer:
    """Adam, or AdamW (decoupled decay) when the network's ``weight_decay > 0``, with fused kernels."""
    name = "adamw" if cfg.weight_decay > 0 else "adam"
    return make_optimizer(name, params, cfg.lr, cfg.weight_decay, betas=betas, implementation="fused")


def _trailing(x: Tensor, like: Tensor) -> Tensor:
    """``x [N, B]`` viewed to broadcast against ``like [N, B, …]``."""
    return x.view(*x.shape, *(1,) * (like.dim() - x.dim()))


def td_target(batch: Metrics, next_value: Tensor, gamma: float) -> Tensor:
    """TD target ``r + γ(1 − terminated)·V(s′)`` of ``next_value`` ``[N, B]`` (or atoms ``[N, B, J]``):
    a time-limit truncation keeps bootstrapping, only a true termination stops it."""
    reward, terminated = _trailing(batch["reward"], next_value), _trailing(batch["terminated"], next_value)
    return reward + gamma * (1.0 - terminated) * next_value


def head_target(head: Head, batch: Metrics, next_out: Tensor, gamma: float, penalty: Tensor | None = None) -> Tensor:
    """The critic head's TD target (held fixed) from the next-state outputs ``[N, C′, B, *head]`` of the
    critics the agent's target reads: the head's :meth:`next_value` of them (a scalar head: their
    minimum) less ``penalty`` ``[N, B]`` (``α log π(a′|s′)``), through :func:`td_target` and the head's
    :meth:`target` (a categorical head: the projection onto its support)."""
    values, weights = head.next_value(next_out)
    if penalty is not None:
        values = values - _trailing(penalty, values)
    return head.target(td_target(batch, values, gamma), weights)


def td_step(losses: Tensor, q: Tensor) -> tuple[Tensor, Metrics]:
    """A critic step's loss ``Σ_n Σ_j mean_i ℓ_{n,j,i}`` from per-example TD losses ``[N, C, B]``;
    metrics: per-seed critic loss and mean Q ``[N]`` (of Q-values ``[N, C, B]``)."""
    per_seed = losses.mean(dim=-1).sum(dim=1)
    return per_seed.sum(), {"loss/critic": per_seed.detach(), "q/mean": q.detach().mean(dim=(1, 2))}


class ActorCritic(Engine):
    """An engine whose networks are ``actor`` (one member per seed) and ``critic`` (``num_critics``
    per seed), with a frozen copy ``target_<net>`` of each net that :attr:`targets` names, built in
    :meth:`networks` (one place, for training, memory estimates and, the actor, exported policies).
    The constructor builds them and the table, SAC's temperature where :attr:`soft`, the acting
    function (:meth:`acting_function`) and the Polyak step; an agent adds its own draws to
    ``next_action`` and ``action`` and writes its losses (:meth:`critic_losses`, :meth:`actor_losses`)."""

    #: the config key of the updates between actor steps, for agents that delay them (TD3, REDQ, DroQ, CrossQ)
    actor_delay: ClassVar[str | None] = None
    #: the networks with a target copy ``target_<net>`` (TD3: both; CrossQ: none)
    targets: ClassVar[tuple[str, ...]] = ("critic",)
    #: the step after which the targets move by Polyak averaging: the critic's, every update (TD3:
    #: the delayed actor's)
    polyak_after: ClassVar[str] = "critic"
    #: whether the actor is SAC's tanh-Gaussian policy with a temperature ``cfg.alpha`` (TD3's: deterministic)
    soft: ClassVar[bool] = True
    #: whether the critic's per-example losses couple the examples (CrossQ's batch statistics)
    coupled: ClassVar[bool] = False
    actor: BatchedNetwork
    critic: BatchedNetwork
    acting: Acting

    def __init__(self, obs_dim: int, act_dim: int, cfg: Any, streams: SeedStreams,
                 device: str | torch.device = "cpu", betas: tuple[float, float] = BETAS) -> None:
        super().__init__(obs_dim, act_dim, cfg, streams)
        self.num_critics = cfg.critic.num_critics
        self.head = make_head(cfg.critic)
        self.draws = {"next_action": (BATCH, act_dim), "action": (BATCH, act_dim)}
        for name, net in self.networks(self.num_seeds, obs_dim, act_dim, cfg, streams).items():
            setattr(self, name, net)
        #: a soft actor's temperature ``log α`` ``[N]`` and target entropy ``H̄ = −target_entropy_scale·|A|``;
        #: None without one (TD3)
        self.log_alpha: nn.Parameter | None = None
        if self.soft:
            self.target_entropy = -cfg.alpha.target_entropy_scale * act_dim
            self.log_alpha = temperature(self.num_seeds, cfg.alpha.init, cfg.alpha.learn)
        self.to(device)
        self._train_actor_critic(actor_groups(self.actor, self.log_alpha, cfg.actor.lr, cfg.alpha.lr)
                                 if self.soft else None, betas)
        self.acting = self.acting_function(cfg)
        self._after = {self.polyak_after: self.polyak(*self.targets)} if self.targets else {}
        if self.actor_delay is not None:  # the actor step's metrics, until its first step
            keys = ("loss/actor", "loss/alpha", "entropy") if self.soft else ("loss/actor",)
            self.last_metrics.update(dict.fromkeys(keys, torch.zeros(self.num_seeds, device=device)))

    # ----------------------------------------------------------------------------- networks and acting
    @classmethod
    def actor_network(cls, members: int, obs_dim: int, act_dim: int, cfg: Any,
                      generators: list[torch.Generator] | None = None) -> BatchedNetwork:
        """The actor of ``members`` members: SAC's tanh-Gaussian policy network."""
        return make_actor(members, obs_dim, act_dim, cfg.actor, generators)

    @classmethod
    def critic_network(cls, members: int, obs_dim: int, act_dim: int, cfg: Any,
                       generators: list[torch.Generator] | None = None) -> BatchedNetwork:
        """The critic of ``members`` members (``num_critics`` per seed): SAC's, with the critic head's width."""
        return make_critic(members, obs_dim, act_dim, cfg.critic, generators, head_width(cfg.critic))

    @classmethod
    def acting_function(cls, cfg: Any) -> Acting:
        """``acting(actor, obs, noise)`` of :meth:`act` and the exported policy: SAC's tanh-Gaussian one."""
        return functools.partial(tanh_gaussian_actions, cfg.actor)

    @classmethod
    def networks(cls, members: int, obs_dim: int, act_dim: int, cfg: Any,
                 streams: SeedStreams | None = None) -> dict[str, nn.Module]:
        """The networks of ``members`` seeds, drawn from ``streams`` (the agent's) or torch's generator:
        the actor, the critic, and a frozen copy ``target_<net>`` of each of :attr:`targets`."""
        c = cfg.critic.num_critics
        nets = {"actor": cls.actor_network(members, obs_dim, act_dim, cfg, member_generators(streams, 1)),
                "critic": cls.critic_network(members * c, obs_dim, act_dim, cfg, member_generators(streams, c))}
        return nets | {f"target_{net}": copy.deepcopy(nets[net]).requires_grad_(False) for net in cls.targets}

    @classmethod
    def export_policy(cls, cfg: Any, actor_state: dict[str, Tensor]) -> nn.Module:
        """The :meth:`actor_network` of ``actor_state`` acting by :meth:`acting_function`."""
        members, obs_dim, act_dim = actor_dims(actor_state)
        actor = cls.actor_network(members, obs_dim, act_dim, cfg)
        actor.load_state_dict(actor_state)
        return ExportedPolicy(actor, cls.acting_function(cfg), act_dim)

    def _train_actor_critic(self, actor_groups: list[dict[str, Any]] | None = None,
                            betas: tuple[float, float] = BETAS) -> None:
        """The table: ``actor`` (``actor_groups``: its optimizer's parameter groups, its own by
        default) and ``critic``, with their targets where the agent has them, Adam with ``betas``,
        and their per-example losses (:meth:`actor_losses`, :meth:`critic_losses`)."""
        cfg = self.cfg
        actor_groups = actor_groups or [{"params": list(self.actor.parameters()), "lr": cfg.actor.lr}]
        self._train({
            "actor": Trained(self.actor, make_optimizer_of(cfg.actor, actor_groups, betas), cfg.actor, 1,
                             lambda b: b["obs"], getattr(self, "target_actor", None),
                             lambda b, noise: self.actor_losses(b, noise)[0]),
            "critic": Trained(self.critic, make_optimizer_of(cfg.critic, list(self.critic.parameters()), betas),
                              cfg.critic, self.num_critics, lambda b: self.critic_inputs(b["obs"], b["action"]),
                              getattr(self, "target_critic", None),
                              lambda b, noise: self.critic_losses(b, noise)[0].flatten(0, 1), self.coupled),
        }, cfg.precision)

    # ----------------------------------------------------------------------------- losses and the update
    def policy(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """A soft actor's ``a ~ π(·|obs)`` with given standard-normal ``noise``; returns ``(a, log π(a))``."""
        return tanh_gaussian(*actor_mean_log_std(self.actor, obs, self.cfg.actor), noise)

    def critic_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """The critic's per-example TD losses ``[N, C, B]`` (target held fixed) and Q-values."""
        raise NotImplementedError

    def actor_losses(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Tensor]:
        """The actor's per-example losses ``[N, B]`` (and an auxiliary ``[N, B]``: a soft actor's ``log π``)."""
        raise NotImplementedError

    @classmethod
    def actor_every(cls, cfg: Any) -> int:
        """Updates between actor steps: ``cfg``'s value at :attr:`actor_delay` (1 without one: SAC)."""
        if cls.actor_delay is None:
            return 1
        section, key = cls.actor_delay.split(".")
        return getattr(getattr(cfg, section), key)

    def steps(self, update: int) -> list[NetStep]:
        """The critic step and, every :meth:`actor_every`-th update, the actor step on the updated
        critic (as jaxrl orders them); the Polyak step of the targets follows the step
        :attr:`polyak_after` names."""
        critic = NetStep("critic", self.critic_step, self._after.get("critic"))
        if update % self.actor_every(self.cfg):
            return [critic]
        return [critic, NetStep("actor", self.actor_step, self._after.get("actor"))]

    def critic_step(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Metrics]:
        """``Σ_n Σ_j mean_i ℓ_{n,j,i}`` of :meth:`critic_losses` (:func:`td_step`); metrics: critic loss
        and mean Q."""
        return td_step(*self.critic_losses(batch, noise))

    def actor_step(self, batch: Metrics, noise: Noise) -> tuple[Tensor, Metrics]:
        """A soft actor's loss ``mean_i ℓ_{n,i}`` of :meth:`actor_losses` plus (where α is learned) the
        temperature loss ``α(H − H̄)``, summed over seeds (:func:`~sac_spectral.agents.networks.soft_actor_step`)."""
        losses, logp = self.actor_losses(batch, noise)
        return soft_actor_step(losses, logp, self.log_alpha, self.target_entropy, self.cfg.alpha.learn)

    def reset(self, last: int | None = None, networks: Sequence[str] | None = None) -> None:
        """The engine's reset; a full one of the actor also resets ``log α`` (where the agent has one)
        and its Adam state."""
        if last is None and self.log_alpha is not None and "actor" in self.reset_networks(networks):
            reset_temperature(self.log_alpha, self.trained["actor"].optimizer, self.cfg.alpha.init)
        super().reset(last, networks)

    def metrics(self) -> Metrics:
        """Per-seed ``[N]`` temperature (where the agent has one) and regularizer metrics (the state,
        not the last update: :meth:`update` returns those)."""
        alpha = {} if self.log_alpha is None else {"alpha": self.log_alpha.detach().exp()}
        return {**alpha, **super().metrics()}

    # ----------------------------------------------------------------------------- critic inputs and values
    def critic_inputs(self, obs: Tensor, action: Tensor) -> Tensor:
        """The critic's input ``[N·C, B, ·]`` for each seed's ``(obs, action)``."""
        n, b = obs.shape[:2]
        x = torch.cat([obs, action], dim=-1).unsqueeze(1).expand(n, self.num_critics, b, -1)
        return x.reshape(n * self.num_critics, b, -1)

    def critic_outputs(self, net: BatchedNetwork, obs: Tensor, action: Tensor, detach: bool = False) -> Tensor:
        """The critic heads' outputs ``[N, num_critics, B, *head.shape]`` for ``obs, action: [N, B, ·]``."""
        n, b = obs.shape[:2]
        return full(net(self.critic_inputs(obs, action), detach)).view(n, self.num_critics, b, *self.head.shape)

    def q_values(self, net: BatchedNetwork, obs: Tensor, action: Tensor, detach: bool = False) -> Tensor:
        """Q-values ``[N, num_critics, B]``: the expectations of the heads' outputs."""
        return self.head.expectation(self.critic_outputs(net, obs, action, detach))

    @torch.inference_mode()
    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Actions ``[N, A]`` for observations ``[N, obs_dim]`` (one per seed), by :attr:`acting`
        with noise from each seed's ``act`` stream unless ``deterministic``."""
        noise = None if deterministic else self.streams.randn("act", (1, self.act_dim))
        return self.acting(self.actor, obs.unsqueeze(1), noise).squeeze(1)

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """Refuse, in one :class:`~sac_spectral.core.config.ConfigError` line, what this agent cannot run
        as ``cfg`` says (checked with the config, before anything is built or written); SAC and TD3
        run every valid config."""

    @classmethod
    def run_warnings(cls, cfg: Any) -> list[str]:
        """What a run of ``cfg`` would silently never do in its ``cfg.total_updates`` updates (an actor
        whose delay exceeds them) and :func:`~sac_spectral.agents.run_checks.regularizer_warnings`."""
        updates, out = cfg.total_updates, []
        if cls.actor_delay is not None:
            delay = cls.actor_every(cfg)
            if updates and delay > updates:
                out.append(f"{cls.actor_delay}={delay} exceeds the run's {updates} updates: the actor never trains")
        out += regularizer_warnings(cfg)
        return out

    @classmethod
    def memory_estimate(cls, cfg: Any, obs_dim: int, act_dim: int) -> dict[str, float]:
        """Bytes of a run (:func:`~sac_spectral.agents.run_checks.memory_parts` of :meth:`networks`)."""
        with torch.random.fork_rng(), torch.device("meta"):
            nets = cls.networks(cfg.num_seeds, obs_dim, act_dim, cfg)
        return memory_parts(cfg, nets, obs_dim, act_dim)


class ExportedPolicy(nn.Module):
    """An agent's acting policy for ``load_policy``: ``forward(obs [M, B, O], member, deterministic,
    generator)`` → member's actions ``[B, A]``, by the agent's own acting function
    ``acting(actor, obs, noise)`` (``noise`` ``[·, B, A]`` standard normal, ``None``: deterministic)."""

    def __init__(self, actor: BatchedNetwork, acting: Acting, act_dim: int) -> None:
        super().__init__()
        self.actor, self.acting, self.act_dim = actor, acting, act_dim

    def forward(self, obs: Tensor, member: int, deterministic: bool, generator: torch.Generator) -> Tensor:
        noise = None if deterministic else torch.randn((obs.shape[1], self.act_dim), generator=generator,
                                                       device=obs.device)
        return self.acting(self.actor, obs, noise)[member]
