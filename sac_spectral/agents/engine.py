"""The update engine: one loop that trains any set of member-batched networks.

An agent declares its **trained networks** in one table (:class:`Trained`: module, optimizer, its
config section with the regularizer specs, members per seed, the network's input for a batch and an
optional target network), and its update as a list of **steps** (:class:`NetStep`: the network, its
loss as a function of the batch and noise, and an optional ``after()`` such as a Polyak step), and
what it draws (:attr:`Engine.draws`: named shapes of standard normals, drawn for every update
from each seed's ``sample`` stream, or only for the updates that step the one network that reads
them, :attr:`Engine.drawn_with`).
:class:`Engine` runs every update, for every agent, as

    loss → penalties → gradient → optimizer step → the network's projection → the network's
    interventions (``after_step``), then its projection again → the step's ``after()`` → count,

step by step. The projection is the network's own constraint
(:meth:`~sac_spectral.core.nets.BatchedNetwork.project`: SimbaV2's weights back onto the unit
sphere; nothing for the others), applied after everything that writes the weights: part of the
optimizer step in both backends, so a compiled program holds it and it never ends a segment, and
after the interventions (shrink & perturb, ReDo, CBP move rows off the sphere) and resets, in the
engine's loop, with the bf16 copies re-cast from what they left. A **backend** computes only the gradient and
optimizer step of a *segment* of consecutive steps: eager (autograd and ``torch.optim``, bf16
weight copies) runs one step per segment; the compiled backend
(:mod:`~sac_spectral.agents.compiled`) runs as many consecutive steps as no intervention separates
as one program, and the ``after()`` of a segment's last step inside
it only where that network has no intervention (so an intervention always runs before the step's
``after()``, as eager runs it). Blocks of several updates (``compile_block``) are one program call
of the same loop where nothing intervenes. Compiled therefore equals eager by construction.

The interventions run before ``after()``, as the references do: Nikishin et al.'s resets re-draw
networks and copy them into their targets before the next target update, and Sokar et al.'s ReDo
re-initializes dormant units right after the optimizer step; a Polyak step then averages the
target toward the network the intervention left. Metrics of each step persist until that step runs
again (TD3's delayed ``loss/actor``), and are checkpointed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from sac_spectral.agents.compiled import Compiled
from sac_spectral.agents.replay import ReplayBuffer
from sac_spectral.agents.steps import (
    Draws,
    Metrics,
    NetStep,
    Noise,
    Segment,
    draw_shapes,
    draw_size,
    intervenes,
    split_draws,
)
from sac_spectral.core.nets import BatchedLinear, BatchedNetwork
from sac_spectral.core.precision import make_precision
from sac_spectral.core.reinit import forget, reset_layers
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.regularizers import Regularizer, build_regularizers, penalized_step


@dataclass
class Trained:
    """One trained network of an agent: its module (``members`` members per seed), optimizer,
    config section (``regularizers`` specs, ``activation``), its input for a training batch
    (``inputs(batch) → [M, B, ·]``: what interventions probe, input statistics observe and
    diagnostics measure features on), the target network that follows it, if any, and its
    per-example losses (``losses(batch, noise) → [M, B]``, noise by name: what its update averages
    and the gradient-rank diagnostics differentiate; ``coupled`` where one example's loss depends on
    the others', through batch statistics). The engine adds the built regularizers."""

    module: BatchedNetwork
    optimizer: torch.optim.Optimizer
    cfg: Any
    members: int
    inputs: Callable[[Metrics], Tensor]
    target: BatchedNetwork | None = None
    losses: Callable[[Metrics, Noise], Tensor] | None = None
    coupled: bool = False
    regularizers: list[Regularizer] = field(default_factory=list)


class Eager:
    """The eager backend: one step per segment, autograd, ``torch.optim``, bf16 weight copies."""

    blocks = False

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        eager_products(engine)

    def segments(self, steps: Sequence[NetStep]) -> list[Segment]:
        return [Segment((step,)) for step in steps]

    def run(self, segment: Segment, batch: Metrics, noise: Noise) -> Metrics:
        """The step's loss (under the precision's forward), penalties, gradient, optimizer step and
        the network's projection."""
        (step,) = segment.steps
        engine, trained = self.engine, self.engine.trained[step.net]
        with engine.precision.forward():
            loss, metrics = step.loss(batch, noise)

        def optimizer_step() -> None:
            engine.precision.collect_grads(step.net)
            trained.optimizer.step()
            trained.module.project()

        penalized_step(loss, trained.optimizer, trained.regularizers, optimizer_step)
        engine.precision.refresh(step.net)
        return metrics


def eager_products(engine: Engine) -> None:
    """Give the engine's layers oneDNN's products (:func:`~sac_spectral.core.onednn.eager_bmm`, used for
    their fp32 CPU products) where ``compile_products`` is ``onednn`` (the default; ``aten`` keeps
    ATen's) and this machine's build of the C++ kernels measured them faster
    (:func:`~sac_spectral.core.onednn.eager_onednn`)."""
    if getattr(engine.cfg, "compile_products", "onednn") != "onednn" or not all(p.is_cpu for p in engine.parameters()):
        return
    from sac_spectral.core import onednn  # the compiler stack, which torch.optim has imported already

    if onednn.eager_onednn():
        for layer in engine.modules():
            if isinstance(layer, BatchedLinear):
                layer.products = onednn.eager_bmm


def row_major(t: Tensor) -> Tensor:
    """``t`` in row-major strides, size-1 dimensions included (``contiguous()`` leaves theirs as
    they are): a call's per-update slices of batches and noise then have the same strides whatever
    the number of updates per call, so a compiled program, guarded on its arguments' strides,
    serves every count."""
    return t.clone(memory_format=torch.contiguous_format)


class Engine(nn.Module):
    """The shared body of every agent (see the module docstring). A subclass builds its networks,
    then calls :meth:`_train` with its table; it writes :meth:`steps` and its losses, and declares
    :attr:`draws`."""

    name: ClassVar[str]
    #: whether ``compile: true`` compiles its update (from :meth:`steps`)
    compiles: ClassVar[bool] = True

    def __init__(self, obs_dim: int, act_dim: int, cfg: Any, streams: SeedStreams) -> None:
        super().__init__()
        self.cfg, self.streams = cfg, streams
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.num_seeds = len(streams)
        self.num_updates = 0
        self.last_metrics: Metrics = {}
        self.trained: dict[str, Trained] = {}
        #: what one update (and one diagnostics probe) draws per seed, by name, in this order:
        #: shapes of standard normals, :data:`~sac_spectral.agents.steps.BATCH` for the batch axis
        self.draws: Draws = {}
        #: draws that only one network's step reads, by name → that network: an update draws them only
        #: where its steps include that network's (DroQ's actor masks at ``policy_delay`` > 1)
        self.drawn_with: dict[str, str] = {}

    def _train(self, table: dict[str, Trained], precision: str) -> None:
        """Train the networks of ``table``: their regularizers, the precision (bf16 copies of every
        network and target) and the backend (compiled with ``compile: true``)."""
        self.trained = table
        self._build_regularizers()
        compiled = getattr(self.cfg, "compile", False) is True and self.compiles  # a run resolves auto first
        self.precision = make_precision("fp32" if compiled else precision, {
            **{n: (t.module, True) for n, t in table.items()},
            **{f"{n}.target": (t.target, False) for n, t in table.items() if t.target is not None},
        })
        self._targets = tuple(f"{n}.target" for n, t in table.items() if t.target is not None)
        self.backend: Eager | Compiled = (Compiled(self, precision == "bf16",
                                                   getattr(self.cfg, "compile_products", "onednn"))
                                          if compiled else Eager(self))

    def generators(self, net: str) -> list[torch.Generator]:
        """Each member's ``init`` stream (seed ``n``'s members ``n·k … n·k + k − 1`` share seed n's)."""
        return [g for g in self.streams["init"] for _ in range(self.trained[net].members)]

    def _build_regularizers(self, networks: Sequence[str] | None = None) -> None:
        """The regularizers of each network in ``networks`` (``None``: every trained one) with its
        optimizer (their probe inputs are handed to them each update: :meth:`update`), its target,
        and per-member random streams seeded from each seed's ``init`` stream (so seed i of a
        multi-seed run draws what a single-seed run draws)."""
        for net in self.trained if networks is None else networks:
            t = self.trained[net]
            t.regularizers = build_regularizers(t.module, t.cfg.regularizers, f"{net}.regularizers")
            for reg in t.regularizers:
                reg.attach(t.optimizer)
                if t.target is not None:
                    reg.set_target(t.target)
                if reg.generators:
                    reg.seed_members([int(torch.randint(2**62, (), generator=g)) for g in self.generators(net)])

    def nets(self) -> dict[str, BatchedNetwork]:
        return {net: t.module for net, t in self.trained.items()}

    def per_seed(self, net: str, value: Tensor) -> Tensor:
        return value if value.dim() == 0 else value.reshape(self.num_seeds, self.trained[net].members).mean(dim=1)

    def polyak(self, *nets: str) -> Callable[[], None]:
        """``after()`` moving the targets of ``nets`` toward them: ``θ̄ ← θ̄ + τ(θ − θ̄)``."""
        targets = [p for n in nets for p in self.trained[n].target.parameters()]
        online = [p.detach() for n in nets for p in self.trained[n].module.parameters()]
        tau = self.cfg.tau

        def after() -> None:
            torch._foreach_lerp_(targets, online, tau)

        return after

    # ----------------------------------------------------------------------------- the loop
    def steps(self, update: int) -> list[NetStep]:
        """The steps of update number ``update`` (counted from 1), in their order."""
        raise NotImplementedError

    def update(self, batch: Metrics, noise: Noise) -> Metrics:
        """One update of every seed on ``batch`` ``[N, B, ...]`` with the named ``noise`` of :attr:`draws`:
        the loop of the module docstring over :meth:`steps`. Returns every step's latest per-seed
        metrics (device tensors, no host sync). Each regularizer's probe is this update's batch, as its
        network's inputs (a block of updates carries no regularizer that probes: :meth:`_block_size`)."""
        update = self.num_updates + 1
        for t in self.trained.values():
            for reg in filter(intervenes, t.regularizers):
                reg.set_probe(partial(t.inputs, batch))
        for segment in self.backend.segments(self.steps(update)):
            self.last_metrics.update(self.backend.run(segment, batch, noise))
            last = segment.steps[-1]
            regs = self.trained[last.net].regularizers
            for reg in regs:
                reg.after_step(update)
            if any(map(intervenes, regs)):
                self._constrain(last.net)
            if last.after is not None and not segment.after_inside:
                last.after()
                self.precision.refresh(*self._targets)
        self.num_updates = update
        return dict(self.last_metrics)

    def draw_noise(self, count: int, batch_size: int) -> Noise:
        """The named noise of updates ``num_updates + 1 …  + count`` on ``batch_size`` transitions, each
        ``[count, N, *shape]`` in :func:`row_major` strides, from each seed's ``sample`` stream: first
        every update's :attr:`draws` (update after update, within one the names one after another),
        then, for each name of :attr:`drawn_with`, its draws for the updates with a step of its
        network, one after another (zeros in the rows of the other updates, which never read them)."""
        shapes, gens = draw_shapes(self.draws, batch_size), self.streams["sample"]
        always = {name: shape for name, shape in shapes.items() if name not in self.drawn_with}
        rows = {name: [r for r in range(count) if any(s.net == net for s in self.steps(self.num_updates + 1 + r))]
                for name, net in self.drawn_with.items()}
        noise = {name: (torch.zeros if name in rows else torch.empty)(count, len(gens), *shape,
                                                                     device=self.streams.device)
                 for name, shape in shapes.items()}
        for i, g in enumerate(gens):  # each seed's draws written straight into their row: one copy
            flat = torch.randn((count, draw_size(always)), generator=g, device=g.device)
            for name, part in split_draws(flat, always).items():
                noise[name][:, i] = part
            for name, r in rows.items():
                if r:
                    noise[name][r, i] = torch.randn((len(r), *shapes[name]), generator=g, device=g.device)
        return noise

    def train_steps(self, buffer: ReplayBuffer, count: int, batch_size: int,
                    before_last: Callable[[], None] | None = None) -> Metrics:
        """``count`` updates on fresh uniform batches; indices and noise for all of them are drawn
        at once from each seed's ``sample`` stream. ``before_last()`` runs just before the last
        update. Where the backend can (:meth:`_block_size`), ``compile_block`` updates run as one
        program call of the same loop. Returns the latest metrics."""
        idx = buffer.sample_indices(self.streams["sample"], (count, batch_size))
        data = {k: row_major(v.transpose(0, 1)) for k, v in buffer.gather(idx).items()}
        noise = self.draw_noise(count, batch_size)
        hook = count - 1 if before_last is not None else count
        r = 0
        while r < count:
            if r == hook:
                before_last()
            size = self._block_size((hook if r < hook else count) - r)
            if size > 1:
                plan = tuple(tuple(self.steps(u)) for u in range(self.num_updates + 1, self.num_updates + 1 + size))
                self.last_metrics.update(self.backend.block(plan, {k: v[r : r + size] for k, v in data.items()},
                                                            {k: v[r : r + size] for k, v in noise.items()}))
                self.num_updates += size
            else:
                batch = {k: v[r] for k, v in data.items()}
                self.observe(batch)
                self.update(batch, {k: v[r] for k, v in noise.items()})
            r += size
        return dict(self.last_metrics)

    def _block_size(self, left: int) -> int:
        """How many of the ``left`` next updates run as one program call (1: one update): blocks
        need the compiled backend, no network keeping input statistics and no intervention."""
        size = getattr(self.cfg, "compile_block", 1)
        if size == 1 or left < size or not self.backend.blocks:
            return 1
        if any(t.module.observes for t in self.trained.values()):
            return 1
        return 1 if any(intervenes(r) for t in self.trained.values() for r in t.regularizers) else size

    def observe(self, batch: Metrics) -> None:
        """Show each network (and its target) that keeps input statistics its training inputs."""
        for t in self.trained.values():
            if t.module.observes:
                x = t.inputs(batch)
                for net in (t.module, t.target):
                    if net is not None:
                        net.observe(x)

    # ----------------------------------------------------------------------------- resets and state
    @torch.no_grad()
    def reset(self, last: int | None = None, networks: Sequence[str] | None = None) -> None:
        """Nikishin et al. (2022) resets: re-draw the last ``last`` levels (``None``: all) of each trained
        network in ``networks`` (``None``: every one), project it
        (:meth:`~sac_spectral.core.nets.BatchedNetwork.project`), copy them into its target and clear
        their optimizer state; a full reset also rebuilds those networks' regularizers. The replay
        buffer is kept by the caller."""
        names = self.reset_networks(networks)
        for net in names:
            t = self.trained[net]
            reset_layers(t.module.tail(last), self.generators(net), t.optimizer)
            t.module.project()
            if t.target is not None:
                for src, dst in zip(t.module.tail(last), t.target.tail(last)):
                    dst.load_state_dict(src.state_dict())
        if last is None:
            self._build_regularizers(names)
        self.precision.refresh()

    def reset_networks(self, networks: Sequence[str] | None) -> tuple[str, ...]:
        """The trained networks a reset of ``networks`` (``None``: all) re-draws; a one-line
        ``ValueError`` for a name the agent does not train."""
        if networks is None:
            return tuple(self.trained)
        unknown = [n for n in networks if n not in self.trained]
        if unknown:
            raise ValueError(f"reset networks: {', '.join(map(repr, unknown))} is not one of "
                             f"{', '.join(self.trained)}")
        return tuple(networks)

    def _constrain(self, net: str) -> None:
        """``net`` after its interventions wrote its weights: its projection (SimbaV2's rows back
        onto the sphere) and its bf16 copies re-cast."""
        self.trained[net].module.project()
        self.precision.refresh(net)

    def forget_optimizers(self) -> None:
        """Clear every trained network's optimizer state (Adam's moments and step count restart, as
        at a task switch with ``on_switch.optimizer: reset``); the parameters stay."""
        for t in self.trained.values():
            forget(t.optimizer, t.module.parameters())

    def metrics(self) -> Metrics:
        """Per-seed ``[N]`` metrics of every regularizer, ``reg/<net>/<name>/<key>``."""
        return {f"reg/{net}/{reg.name}/{key}": self.per_seed(net, value)
                for net, t in self.trained.items() for reg in t.regularizers for key, value in reg.metrics().items()}

    def full_state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, regularizer state, the latest metrics and the update count."""
        return {
            "modules": self.state_dict(),
            "optimizers": {net: t.optimizer.state_dict() for net, t in self.trained.items()},
            "regularizers": {net: [r.state_dict() for r in t.regularizers] for net, t in self.trained.items()},
            "last_metrics": dict(self.last_metrics),
            "num_updates": self.num_updates,
        }

    def load_full_state_dict(self, state: dict[str, Any]) -> None:
        state = upgrade_state(state)
        self.load_state_dict(state["modules"])
        for net, t in self.trained.items():
            t.optimizer.load_state_dict(state["optimizers"][net])
            for reg, s in zip(t.regularizers, state["regularizers"][net], strict=True):
                reg.load_state_dict(s)
        device = next(self.parameters()).device
        self.last_metrics.update({k: v.to(device) for k, v in state["last_metrics"].items()})
        self.num_updates = int(state["num_updates"])
        self.precision.refresh()


def upgrade_state(state: dict[str, Any]) -> dict[str, Any]:
    """An agent checkpoint in the engine's layout; older ones (an actor's and a critic's optimizer
    and regularizers under their own keys, TD3's delayed actor loss) are converted."""
    if "optimizers" in state:
        return state
    nets = ("actor", "critic")
    return {
        "modules": state["modules"],
        "optimizers": {n: state[f"{n}_opt"] for n in nets},
        "regularizers": {n: state[f"{n}_regs"] for n in nets},
        "last_metrics": {"loss/actor": state["actor_loss"]} if "actor_loss" in state else {},
        "num_updates": state["num_updates"],
    }
