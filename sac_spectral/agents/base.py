"""The agent protocol and registry: what the layers above (runner, ``load_policy``, ``play``,
``diagnose``, the memory check, the sweep's cost model) may ask of an agent, and the shared body of
the member-batched actor-critic agents.

An agent is one file with a class decorated ``@register_agent("name")``; the run config selects it
with ``agent: name``. Every agent's networks are member-batched: the actor has one member per
seed, the critic ``num_critics`` per seed (seed ``n``'s critics are members ``n·C … n·C + C − 1``).

:class:`ActorCritic` holds what every such agent shares and defines it once: building each
network's regularizers (seeded per member from each seed's ``init`` stream), the regularized
optimizer step (penalty → gradient → optimizer step → ``after_step``), a block of updates on
uniformly sampled batches, the critic's input layout, per-seed averages of per-member values,
regularizer metrics, resets of the networks' last levels, and the state that checkpoints hold.
An agent adds its networks, its per-example losses and its ``update``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from sac_spectral.agents.compiled import CompiledUpdate
from sac_spectral.agents.replay import ReplayBuffer
from sac_spectral.core.config import ConfigError
from sac_spectral.core.nets import BatchedNetwork
from sac_spectral.core.optim import make_optimizer
from sac_spectral.core.precision import make_precision
from sac_spectral.core.sizes import ADAM_COPIES, FLOAT32
from sac_spectral.core.reinit import reset_layers
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.regularizers import Regularizer, build_regularizers, parameter_copies, regularized_step

Metrics = dict[str, Tensor]


@runtime_checkable
class Agent(Protocol):
    """What the layers above an agent use. Tensors carry a leading seed axis ``N``."""

    name: ClassVar[str]
    compiles: ClassVar[bool]
    obs_dim: int
    act_dim: int
    num_seeds: int
    num_updates: int

    def act(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Actions ``[N, A]`` in ``[-1, 1]`` for observations ``[N, obs_dim]``."""

    def train_steps(self, buffer: ReplayBuffer, count: int, batch_size: int,
                    before_last: Callable[[], None] | None = None) -> Metrics:
        """A block of ``count`` updates on fresh batches (``before_last()`` runs just before the
        last one); the last update's per-seed metrics."""

    def metrics(self) -> Metrics:
        """Per-seed ``[N]`` metrics of the agent's state (temperature, regularizers)."""

    def reset(self, last: int | None = None) -> None:
        """Re-draw every network (``None``) or their last ``last`` levels; the buffer stays."""

    def nets(self) -> dict[str, BatchedNetwork]:
        """The trained networks that regularizers, spectra and diagnostics see."""

    def per_seed(self, net: str, value: Tensor) -> Tensor:
        """Average a per-member ``[M]`` value of ``net`` over each seed's members."""

    def critic_losses(self, batch: Metrics, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Per-example critic losses ``[N, C, B]`` (and Q-values) for gradient-rank diagnostics."""

    def actor_losses(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Per-example actor losses ``[N, B]`` (and an auxiliary ``[N, B]``)."""

    def critic_inputs(self, obs: Tensor, action: Tensor) -> Tensor:
        """The critic's input ``[N·C, B, ·]`` for each seed's ``(obs, action)``."""

    def full_state_dict(self) -> dict[str, Any]: ...

    def load_full_state_dict(self, state: dict[str, Any]) -> None: ...

    @classmethod
    def networks(cls, members: int, obs_dim: int, act_dim: int, cfg: Any) -> dict[str, nn.Module]:
        """The trained networks of ``members`` seeds as built (for memory estimates), untrained."""

    @classmethod
    def memory_estimate(cls, cfg: Any, obs_dim: int, act_dim: int) -> dict[str, float]:
        """Bytes a run of ``cfg`` allocates, by part (for the check before anything is built)."""

    @classmethod
    def export_policy(cls, cfg: Any, actor_state: dict[str, Tensor]) -> nn.Module:
        """The acting policy from the checkpoint's actor weights: ``forward(obs [M, B, O], member,
        deterministic, generator) → member's actions [B, A]`` in ``[-1, 1]`` (what ``load_policy``
        runs; every member sees the batch, as in the trainer's batched act)."""


def actor_dims(actor_state: dict[str, Tensor]) -> tuple[int, int, int]:
    """``(members, obs_dim, act_dim)`` of an actor's state dict: its first weight ``[M, out, obs]``
    and its first head ``[M, act, ·]``; a ``KeyError`` / ``ValueError`` where it has neither."""
    first = next(v for k, v in actor_state.items() if k.endswith("weight") and v.dim() == 3)
    return first.shape[0], first.shape[2], actor_state["heads.0.weight"].shape[1]


@dataclass(frozen=True)
class NetStep:
    """One network's step within an update: ``loss(batch, noise) → (scalar loss, metrics)``, a
    function of that network's parameters (and of nothing the other steps of the update still
    change), then ``after()``: in-place work on tensors that are not trained (a Polyak step of
    targets). The agent's :meth:`ActorCritic.steps` lists an update's steps in their order; eager
    and compiled updates both run that list."""

    net: str
    loss: Callable[[Metrics, Tensor], tuple[Tensor, Metrics]]
    after: Callable[[], None] | None = None


AGENTS: dict[str, type] = {}


def register_agent(name: str) -> Callable[[type], type]:
    """Class decorator: make the agent selectable as ``agent: name`` in run configs."""

    def wrap(cls: type) -> type:
        if name in AGENTS and AGENTS[name] is not cls:
            raise ValueError(f"agent '{name}' is already registered ({AGENTS[name].__qualname__})")
        cls.name = name
        AGENTS[name] = cls
        return cls

    return wrap


def agent_class(name: str) -> type:
    """The registered agent ``name``; a one-line :class:`ConfigError` naming the choices otherwise."""
    if name not in AGENTS:
        raise ConfigError(f"agent: unknown agent '{name}'; choose one of {', '.join(sorted(AGENTS))}")
    return AGENTS[name]


def build_agent(obs_dim: int, act_dim: int, cfg: Any, streams: SeedStreams, device: str | torch.device = "cpu") -> Agent:
    """The agent ``cfg.agent`` names, for ``len(streams)`` seeds."""
    return agent_class(cfg.agent)(obs_dim, act_dim, cfg, streams, device)


def make_optimizers(cfg: Any, actor_groups: list[dict[str, Any]], critic: nn.Module) -> dict[str, torch.optim.Optimizer]:
    """Adam, or AdamW (decoupled decay) when the network's ``weight_decay > 0``, for the actor's
    parameter groups and the critic, with fused kernels."""
    return {
        net: make_optimizer("adamw" if c.weight_decay > 0 else "adam", params, c.lr, c.weight_decay, implementation="fused")
        for net, c, params in (("actor", cfg.actor, actor_groups), ("critic", cfg.critic, critic.parameters()))
    }


class ActorCritic(nn.Module):
    """The shared body of member-batched actor-critic agents (see the module docstring). A subclass
    builds ``actor``, ``critic`` and ``target_critic`` (and any other networks), then calls
    :meth:`_setup` with its optimizers and the networks that bf16 precision copies."""

    name: ClassVar[str]
    #: whether ``compile: true`` compiles its update (from :meth:`steps`)
    compiles: ClassVar[bool] = True

    def __init__(self, obs_dim: int, act_dim: int, cfg: Any, streams: SeedStreams) -> None:
        super().__init__()
        self.cfg, self.streams = cfg, streams
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.num_seeds = len(streams)
        self.num_critics = cfg.critic.num_critics
        self.num_updates = 0
        self._batch: Metrics = {}

    def _setup(self, optimizers: dict[str, torch.optim.Optimizer], precise: dict[str, tuple[nn.Module, bool]],
               precision: str) -> None:
        """Optimizers per trained network, their regularizers, the precision object and, with
        ``compile: true``, the compiled update (whose bf16 is a cast inside its programs, not a set
        of weight copies)."""
        self.optimizers = optimizers
        self.actor_regs, self.critic_regs = self._build_regularizers()
        compiled = bool(getattr(self.cfg, "compile", False)) and self.compiles
        self.precision = make_precision("fp32" if compiled else precision, precise)
        self._compiled = CompiledUpdate(self, precision == "bf16") if compiled else None

    def _critic_generators(self) -> list[torch.Generator]:
        return [g for g in self.streams["init"] for _ in range(self.num_critics)]

    def nets(self) -> dict[str, BatchedNetwork]:
        return {"actor": self.actor, "critic": self.critic}

    def per_seed(self, net: str, value: Tensor) -> Tensor:
        if value.dim() == 0:
            return value
        return value.reshape(self.num_seeds, 1 if net == "actor" else self.num_critics).mean(dim=1)

    def critic_inputs(self, obs: Tensor, action: Tensor) -> Tensor:
        n, b = obs.shape[:2]
        x = torch.cat([obs, action], dim=-1).unsqueeze(1).expand(n, self.num_critics, b, -1)
        return x.reshape(n * self.num_critics, b, -1)

    def q_values(self, net: BatchedNetwork, obs: Tensor, action: Tensor, detach: bool = False) -> Tensor:
        """``[N, num_critics, B]`` Q-values of ``obs, action: [N, B, ·]``."""
        n, b = obs.shape[:2]
        return net(self.critic_inputs(obs, action), detach).float().view(n, self.num_critics, b)

    @classmethod
    def memory_estimate(cls, cfg: Any, obs_dim: int, act_dim: int) -> dict[str, float]:
        """Bytes of a run: the replay buffer, the networks as :meth:`networks` builds them (on the
        meta device; trained ones with gradients, Adam moments and their regularizers' parameter
        copies, ``target_*`` ones once), one step's batches and a batch's activations (each hidden
        unit keeps its pre- and post-activation for backward and gets a gradient of each), and the
        diagnostics' per-example gradients."""
        n, c, b = cfg.num_seeds, cfg.critic.num_critics, cfg.batch_size
        transition = 2 * obs_dim + act_dim + 2
        with torch.random.fork_rng(), torch.device("meta"):
            nets = cls.networks(n, obs_dim, act_dim, cfg)
        counts = {k: sum(p.numel() for p in net.parameters()) for k, net in nets.items()}
        networks = sum(v * (ADAM_COPIES + parameter_copies(getattr(cfg, k).regularizers)) if not k.startswith("target")
                       else v for k, v in counts.items())
        critic_sizes = [obs_dim + act_dim, *cfg.critic.hidden, 1]
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
        if cfg.diagnostics.every:
            per_member = max(counts["critic"] // (n * c), counts["actor"] // n)
            parts["diagnostics probe"] = FLOAT32 * n * c * min(cfg.diagnostics.batch_size, cfg.buffer_size) * per_member
        return parts

    # ----------------------------------------------------------------------------- regularized steps
    def _build_regularizers(self) -> tuple[list[Regularizer], list[Regularizer]]:
        """Each network's regularizers with its optimizer, its inputs of the current update as probe,
        and per-member random streams seeded from each seed's ``init`` stream (so seed i of a
        multi-seed run draws what a single-seed run draws)."""
        built = {}
        for net, gens in (("actor", self.streams["init"]), ("critic", self._critic_generators())):
            regs = build_regularizers(getattr(self, net), getattr(self.cfg, net).regularizers, f"{net}.regularizers")
            for reg in regs:
                reg.attach(self.optimizers[net])
                reg.set_probe(functools.partial(self._probe, net))
                if (target := getattr(self, f"target_{net}", None)) is not None:
                    reg.set_target(target)
                if reg.generators:
                    reg.seed_members([int(torch.randint(2**62, (), generator=g)) for g in gens])
            built[net] = regs
        return built["actor"], built["critic"]

    def _probe(self, net: str) -> Tensor:
        """``net``'s inputs in the current update (what interventions such as ReDo score units on)."""
        obs = self._batch["obs"]
        return obs if net == "actor" else self.critic_inputs(obs, self._batch["action"])

    def _step(self, net: str, loss: Tensor) -> None:
        """``net``'s regularized optimizer step (its bf16 copies' gradients collected before it and
        the copies re-cast after it)."""
        def step() -> None:
            self.precision.collect_grads(net)
            self.optimizers[net].step()

        regs = self.actor_regs if net == "actor" else self.critic_regs
        regularized_step(loss, self.optimizers[net], regs, self.num_updates + 1, step)
        self.precision.refresh(net)

    def steps(self, update: int) -> list[NetStep]:
        """The steps of update number ``update`` (counted from 1), in their order (the agent's
        update, written once)."""
        raise NotImplementedError

    def update(self, batch: Metrics, noise: Tensor) -> Metrics:
        """One update of every seed on ``batch`` ``[N, B, ...]`` with ``noise`` ``[2, N, B, A]``:
        each of :meth:`steps` in order — its loss (under the precision's forward), the network's
        regularized optimizer step (penalties, gradient, step, ``after_step``), then its
        ``after()`` — eagerly, or as compiled programs with ``compile: true``. Returns the steps'
        per-seed metrics (device tensors, no host sync)."""
        self._batch = batch
        if self._compiled is not None:
            info = self._compiled(batch, noise)
        else:
            info = {}
            for step in self.steps(self.num_updates + 1):
                with self.precision.forward():
                    loss, metrics = step.loss(batch, noise)
                self._step(step.net, loss)
                if step.after is not None:
                    step.after()
                info.update(metrics)
        self.num_updates += 1
        return info

    def train_steps(self, buffer: ReplayBuffer, count: int, batch_size: int,
                    before_last: Callable[[], None] | None = None) -> Metrics:
        """``count`` updates on fresh uniform batches; indices and noise for all of them are drawn
        at once from each seed's ``sample`` stream. ``before_last()`` runs just before the last
        update (what the plasticity metrics of one update measure from). With ``compile: true``
        the updates run ``compile_block`` per program call where the compiled update can take
        them as a block (:meth:`CompiledUpdate.block`), the rest one call each. Returns the last
        update's metrics."""
        idx = buffer.sample_indices(self.streams["sample"], (count, batch_size))
        data = {k: v.transpose(0, 1).contiguous() for k, v in buffer.gather(idx).items()}
        noise = self.streams.randn("sample", (count, 2, batch_size, self.act_dim)).permute(1, 2, 0, 3, 4)
        info: Metrics = {}
        hook = count - 1 if before_last is not None else count
        r = 0
        while r < count:
            if r == hook:
                before_last()
            size = self._block_size((hook if r < hook else count) - r)
            if size > 1:
                info = self._compiled.block({k: v[r : r + size] for k, v in data.items()}, noise[r : r + size])
                self._batch = {k: v[r + size - 1] for k, v in data.items()}
                self.num_updates += size
            else:
                batch = {k: v[r] for k, v in data.items()}
                self.observe(batch)
                info = self.update(batch, noise[r])
            r += size
        return info

    def _block_size(self, left: int) -> int:
        """How many of the ``left`` next updates run as one compiled block (1: one update)."""
        size = getattr(self.cfg, "compile_block", 1)
        if self._compiled is None or left < size or size == 1 or self.actor.observes or self.critic.observes:
            return 1
        return size if self._compiled.blockable() else 1

    def observe(self, batch: Metrics) -> None:
        """Show each network (and its target) the inputs of a training batch, before the update:
        networks that keep input statistics (SimBa's) update them; the others do nothing."""
        if self.actor.observes:
            for net in (self.actor, getattr(self, "target_actor", None)):
                if net is not None:
                    net.observe(batch["obs"])
        if self.critic.observes:
            x = self.critic_inputs(batch["obs"], batch["action"])
            self.critic.observe(x)
            self.target_critic.observe(x)

    # ----------------------------------------------------------------------------- resets and state
    @torch.no_grad()
    def reset(self, last: int | None = None) -> None:
        """Nikishin et al. (2022) resets: re-draw the last ``last`` levels (``None``: all;
        :func:`~sac_spectral.core.layers.layer_tail` counts them, the heads are the last level) of
        actor and critics, copy them into their targets (``target_actor``, ``target_critic`` where
        the agent has them) and clear their Adam moments; a full reset also rebuilds the
        regularizers. The replay buffer is kept by the caller."""
        for net, gens in (("actor", self.streams["init"]), ("critic", self._critic_generators())):
            online, target = getattr(self, net), getattr(self, f"target_{net}", None)
            reset_layers(online.tail(last), gens, self.optimizers[net])
            if target is not None:
                for src, dst in zip(online.tail(last), target.tail(last)):
                    dst.load_state_dict(src.state_dict())
        if last is None:
            self.actor_regs, self.critic_regs = self._build_regularizers()
        self.precision.refresh()

    def metrics(self) -> Metrics:
        """Per-seed ``[N]`` metrics of the agent's state: every regularizer's, ``reg/<net>/<name>/<key>``."""
        out = {}
        for net, regs in (("actor", self.actor_regs), ("critic", self.critic_regs)):
            for reg in regs:
                for key, value in reg.metrics().items():
                    out[f"reg/{net}/{reg.name}/{key}"] = self.per_seed(net, value)
        return out

    def full_state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, regularizer state and update count."""
        return {
            "modules": self.state_dict(),
            "actor_opt": self.optimizers["actor"].state_dict(),
            "critic_opt": self.optimizers["critic"].state_dict(),
            "actor_regs": [r.state_dict() for r in self.actor_regs],
            "critic_regs": [r.state_dict() for r in self.critic_regs],
            "num_updates": self.num_updates,
        }

    def load_full_state_dict(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["modules"])
        self.optimizers["actor"].load_state_dict(state["actor_opt"])
        self.optimizers["critic"].load_state_dict(state["critic_opt"])
        for reg, s in zip(self.actor_regs, state["actor_regs"], strict=True):
            reg.load_state_dict(s)
        for reg, s in zip(self.critic_regs, state["critic_regs"], strict=True):
            reg.load_state_dict(s)
        self.num_updates = int(state["num_updates"])
        self.precision.refresh()
