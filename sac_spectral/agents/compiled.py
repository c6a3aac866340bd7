"""The compiled backend of the update engine (``compile: true``): the gradients and optimizer steps
of a segment of an agent's steps (:meth:`~sac_spectral.agents.engine.Engine.steps`) as one program.

Each step is written as a function of its network's parameters — its loss through
:func:`torch.func.functional_call`, its gradient by :func:`torch.func.grad_and_value`, the
regularizers' penalty gradients (:meth:`~sac_spectral.regularizers.Regularizer.penalty_and_grads`,
the formula eager's ``penalty()`` differentiates) added, the Adam/AdamW step of
:func:`~sac_spectral.core.optim.adam_step_` and the network's projection
(:meth:`~sac_spectral.core.nets.BatchedNetwork.project`, SimbaV2's) — so that ``torch.compile`` sees forward, backward,
penalties, optimizer step and the ``after()`` (a Polyak step) of the steps before the last as one
graph and fuses their elementwise work (inductor's C++ code on the CPU; CUDA graphs on a GPU).
On the CPU the program's matrix products, forward and backward, run as oneDNN batched matmuls
(:mod:`sac_spectral.core.onednn`, an inductor pass; ATen's ``bmm`` with ``compile_products:
aten`` or, in one warning, where the operator cannot be built), the Adam steps as torch's fused
kernel (its CPU kernel in C++: :mod:`sac_spectral.core.native`), and the program's calls from
inductor's C++ wrapper rather than its Python one (0.93× the time per update at one seed).
Consecutive steps form one program; a program ends after a step whose network has a regularizer
that intervenes after steps (shrink & perturb, ReDo, resets…): the engine's loop then runs that
``after_step`` and only then the step's ``after()``, as eager does. The last step's ``after()``
runs inside only where its network has no intervention. Updates whose step lists differ (TD3's
delayed actor) get a program each, and so do states of a regularizer that its network's forward
reads (:meth:`~sac_spectral.regularizers.Regularizer.traced_state`: plasticity injection's).

The programs write the agent's own parameters and its optimizers' own Adam state in place, so
checkpoints, resets, evaluation and the regularizers see one set of tensors, and a run may resume
with or without compile. The penalties' state (the spectral power-iteration vectors) is updated
in place inside the program, as eager updates it. ``precision: bf16`` casts the
linear layers' weights to bf16 inside the program (bf16 matmuls on fp32 masters, as eager's bf16
copies give). A program is specialised to its agent's structure and configuration at the first
call; only its arguments (steps, batch, noise, the regularizers with penalties, Adam state and
hyperparameters) are guarded. :meth:`Compiled.block` runs several consecutive updates as one
program (``compile_block``) where no regularizer intervenes between them. A program's first call,
its compile (minutes the first time on a machine), says so in a line, and then how long it took.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import sys
import time
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value

from sac_spectral.agents.steps import Metrics, NetStep, Noise, Segment, intervenes
from sac_spectral.core.functional import Bound
from sac_spectral.core.nets import BatchedLinear
from sac_spectral.core.optim import adam_state, adam_step_
from sac_spectral.regularizers import Regularizer

if TYPE_CHECKING:
    from sac_spectral.agents.engine import Engine

#: minutes a program of one update, and one of a block of updates, takes to compile the first time on
#: a machine (inductor caches it on disk; a later process compiles it again in seconds): the quick
#: config's update took 240 s on 2 cores at load average 8, a block of 8 of them 421 s at 6
COMPILE_MINUTES, BLOCK_COMPILE_MINUTES = "1–5", "2–10"
#: a regularizer with a penalty, its tensors' places among the trained ones, and the untrained ones
Penalty = tuple[Regularizer, tuple["int | None", ...], tuple["Tensor | None", ...]]


class _Step:
    """One network's trained tensors (aliases of its parameters, in its optimizer's order) and the
    optimizer's groups as index ranges with their hyperparameters."""

    def __init__(self, wrapper: Bound, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        names = {id(p): n for n, p in wrapper.named_parameters()}
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.names = [names[id(p)] for p in self.params]
        self.aliases = [p.detach() for p in self.params]
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.decoupled = isinstance(optimizer, torch.optim.AdamW)
        self.groups, start = [], 0
        for g in optimizer.param_groups:
            self.groups.append((start, start + len(g["params"])))
            start += len(g["params"])

    def hyper(self) -> tuple[tuple[float, tuple[float, float], float, float], ...]:
        """Each group's ``(lr, betas, eps, weight_decay)`` as they are now."""
        return tuple((g["lr"], tuple(g["betas"]), g["eps"], g["weight_decay"]) for g in self.optimizer.param_groups)

    def penalties(self, regs: Sequence[Regularizer]) -> tuple[Penalty, ...]:
        """The regularizers with penalties, each with its penalized tensors: the place of each among
        :attr:`params`, or (a tensor this optimizer does not train) its value."""
        out = []
        for reg in (r for r in regs if r.has_penalty):
            tensors = reg.penalized()
            places = tuple(self.index.get(id(t)) for t in tensors)
            out.append((reg, places, tuple(None if i is not None else t.detach() for i, t in zip(places, tensors))))
        return tuple(out)

    def add_penalties(self, grads: list[Tensor], penalties: Sequence[Penalty]) -> None:
        """Add each penalty's gradient at the current parameters to ``grads`` (traced into the program)."""
        for reg, places, fixed in penalties:
            _, extra = reg.penalty_and_grads([f if i is None else self.aliases[i] for i, f in zip(places, fixed)])
            for i, g in zip(places, extra):
                if i is not None:
                    grads[i] = grads[i] + g

    def apply(self, grads: list[Tensor], state: tuple[list[Tensor], ...],
              hyper: tuple[tuple[float, tuple[float, float], float, float], ...]) -> None:
        """Adam/AdamW on the aliases, group by group (traced into the program)."""
        for (lo, hi), (lr, betas, eps, wd) in zip(self.groups, hyper):
            adam_step_(self.aliases[lo:hi], grads[lo:hi], *(s[lo:hi] for s in state), lr, betas, eps, wd,
                       self.decoupled)


def _never(*args: Any) -> bool:
    return False


@functools.cache
def _import_inductor() -> None:
    """Import inductor's compiler once, without the deprecation warnings (14 in torch 2.13) that
    the TorchScript classes of ``torch.utils.mkldnn``, which its passes import, print."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`torch.jit.script_method` is deprecated", DeprecationWarning)
        import torch._inductor.compile_fx  # noqa: F401


@functools.cache
def _cpu_products() -> dict[str, Any]:
    """Inductor's options for the CPU programs' products: oneDNN's (:mod:`sac_spectral.core.onednn`),
    or, where its kernels cannot be built or loaded, ATen's ``bmm`` with a one-line warning that says why."""
    from sac_spectral.core import native, onednn

    if (why := native.load()) is not None:
        print(f"warning: compiled products stay on torch.bmm: {why}", file=sys.stderr, flush=True)
        return {}
    return {"post_grad_custom_post_pass": onednn.OneDnnProducts()}


@functools.cache
def _cpp_scheduling() -> type:
    """Inductor's CPU scheduling class, imported once (not per program call, nor by eager runs)."""
    from torch._inductor.codegen.cpp import CppScheduling

    return CppScheduling


@contextlib.contextmanager
def _inductor_workarounds() -> Iterator[None]:
    """Inductor's CPU outer-loop fusion with local buffers fails (``KeyError: 'buf190'`` in
    ``try_outer_loop_fusion_with_local_buf``, torch 2.13) on the programs of residual LayerNorm
    networks with a penalty (BroNet, SimBa with the spectral regularizer): it is off while a
    program runs, so for the programs' compiles alone."""
    scheduling = _cpp_scheduling()
    original = scheduling.can_fuse_vertical_outer_loop
    scheduling.can_fuse_vertical_outer_loop = _never
    try:
        yield
    finally:
        scheduling.can_fuse_vertical_outer_loop = original


def _own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of the function ``fn`` with a code object of its own. Dynamo keeps its compiled
    programs, and counts them against its recompile limit, per code object: each agent's programs
    get their own, so that those of another agent in the process (whose guards on ``self`` are
    dropped) are never tried, and many agents in one process never reach the limit."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _argument_guards(guards: Sequence[Any]) -> list[bool]:
    """Keep the guards on the programs' arguments (steps, batch, noise, the regularizers with
    penalties, Adam state and hyperparameters) and drop those on the agent (``self``) and globals: the agent's
    structure, configuration and parameter tensors (written in place, never replaced) are fixed for the life
    of its :class:`Compiled` backend, and checking some 800 guards on them cost ≈ 0.5 ms per call."""
    return [not (g.is_global or g.name == "self" or g.name.startswith("self.")) for g in guards]


class _Program:
    """A compiled program that says, at its first call (its compile), what it compiles and then how
    long that took."""

    def __init__(self, program: Callable[..., Any], what: str, minutes: str) -> None:
        self.program, self.what, self.minutes, self.compiled = program, what, minutes, False

    def __call__(self, *args: Any) -> Any:
        if self.compiled:
            return self.program(*args)
        print(f"compiling {self.what} (first time on this machine: ~{self.minutes} min; cached afterwards)",
              file=sys.stderr, flush=True)
        start = time.perf_counter()
        out = self.program(*args)
        self.compiled = True
        print(f"compiled {self.what} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        return out


class Compiled:
    """The compiled backend of an :class:`~sac_spectral.agents.engine.Engine`: its segments as
    programs, and blocks of updates."""

    blocks = True

    def __init__(self, agent: Engine, bf16: bool = False, products: str = "onednn") -> None:
        self.agent, self.products = agent, products
        self.wrapper = Bound(agent)
        self.nets = {net: _Step(self.wrapper, t.optimizer) for net, t in agent.trained.items()}
        self.params = {n: p.detach() for n, p in self.wrapper.named_parameters()}
        self.low = {f"root.{n}.{k}" for n, m in agent.named_modules() if isinstance(m, BatchedLinear)
                    for k, _ in m.named_parameters()} if bf16 else set()
        cuda = next(agent.parameters()).device.type == "cuda"
        _import_inductor()
        # auto-functionalization v2 misorders the Adam operator's writes in blocks of updates (torch 2.13)
        options = {"guard_filter_fn": _argument_guards, "enable_auto_functionalized_v2": False,
                   **({} if cuda else {"cpp_wrapper": True, **(_cpu_products() if products == "onednn" else {})})}
        self._compile = functools.partial(torch.compile, mode="reduce-overhead" if cuda else None, dynamic=False,
                                          options=options)
        self._programs: dict[tuple[Any, ...], Any] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> Compiled:
        """A copied agent gets its own programs (compiled ones close over this agent)."""
        return Compiled(copy.deepcopy(self.agent, memo), bool(self.low), self.products)

    def _regs(self, net: str) -> list[Regularizer]:
        return self.agent.trained[net].regularizers

    def _program(self, key: tuple[Any, ...], fn: Callable[..., Any], what: str, minutes: str) -> _Program:
        """The program of ``key`` (with the traced state of every regularizer), compiled once, at its
        first call, which says so: ``what`` it is, and how many ``minutes`` a first compile takes."""
        key = (*key, tuple(r.traced_state() for t in self.agent.trained.values() for r in t.regularizers))
        if key not in self._programs:
            self._programs[key] = _Program(self._compile(types.MethodType(_own_code(fn), self)), what, minutes)
        return self._programs[key]

    def segments(self, steps: Sequence[NetStep]) -> list[Segment]:
        """The programs of ``steps``: a segment ends after a step whose regularizers intervene, and
        that step's ``after()`` is left to the engine's loop."""
        out, current = [], []
        for i, step in enumerate(steps):
            current.append(step)
            intervened = any(intervenes(r) for r in self._regs(step.net))
            if i == len(steps) - 1 or intervened:
                key = (i, tuple((s.net, s.after is not None) for s in current), not intervened)
                program = self._program(key, Compiled._run, "the update", COMPILE_MINUTES)
                out.append(Segment(tuple(current), not intervened, program))
                current = []
        return out

    def _loss(self, step: NetStep, batch: Metrics, noise: Noise, params: list[Tensor]) -> tuple[Tensor, Metrics]:
        substituted = {**self.params, **dict(zip(self.nets[step.net].names, params))}
        if self.low:
            substituted = {n: t.to(torch.bfloat16) if n in self.low else t for n, t in substituted.items()}
        loss, metrics = functional_call(self.wrapper, substituted, (step.loss, batch, noise))
        return loss, metrics

    def _run(self, steps: tuple[NetStep, ...], after_inside: bool, batch: Metrics, noise: Noise,
             args: Sequence[tuple[Any, ...]]) -> Metrics:
        """A segment's steps, traced into one program."""
        info: Metrics = {}
        for i, (step, (penalties, state, hyper)) in enumerate(zip(steps, args)):
            net = self.nets[step.net]
            grads, (_, metrics) = grad_and_value(functools.partial(self._loss, step, batch, noise),
                                                 has_aux=True)(net.aliases)
            grads = list(grads)
            net.add_penalties(grads, penalties)
            net.apply(grads, state, hyper)
            self.agent.trained[step.net].module.project()
            if step.after is not None and (after_inside or i < len(steps) - 1):
                step.after()
            info.update(metrics)
        return info

    def _args(self, net: str) -> tuple[Any, ...]:
        """A step's program arguments: the penalties, Adam state and hyperparameters of ``net``."""
        step = self.nets[net]
        return step.penalties(self._regs(net)), adam_state(step.optimizer, step.params), step.hyper()

    def run(self, segment: Segment, batch: Metrics, noise: Noise) -> Metrics:
        with _inductor_workarounds():
            return segment.program(segment.steps, segment.after_inside, batch, noise,
                                   [self._args(s.net) for s in segment.steps])

    def _block(self, plan: tuple[tuple[NetStep, ...], ...], data: Metrics, noise: Noise,
               args: dict[str, tuple[Any, ...]]) -> Metrics:
        """``len(plan)`` updates, update ``r`` on ``data[·][r]``, ``noise[·][r]``, traced into one program."""
        info: Metrics = {}
        for r, steps in enumerate(plan):
            info.update(self._run(steps, True, {k: v[r] for k, v in data.items()}, {k: v[r] for k, v in noise.items()},
                                  [args[s.net] for s in steps]))
        return info

    def block(self, plan: tuple[tuple[NetStep, ...], ...], data: Metrics, noise: Noise) -> Metrics:
        """The updates of ``plan`` (each one's steps) as one program call, on batches ``data[·][r]``
        ``[R, N, B, ...]`` and named noise ``noise[·][r]`` ``[R, N, ...]``, where nothing intervenes; the program is
        specialised to the block's length and step lists. Returns each step's latest metrics; the
        engine counts the updates."""
        key = ("block", tuple(tuple((s.net, s.after is not None) for s in steps) for steps in plan))
        program = self._program(key, Compiled._block, f"a block of {len(plan)} updates", BLOCK_COMPILE_MINUTES)
        with _inductor_workarounds():
            return program(plan, data, noise, {net: self._args(net) for net in self.nets})
