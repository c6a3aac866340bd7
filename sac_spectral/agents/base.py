"""The agent protocol and registry: what the layers above (runner, ``load_policy``, ``play``,
``diagnose``, the memory check, the sweep's cost model) may ask of an agent.

An agent is one file with a class decorated ``@register_agent("name")``; the run config selects it
with ``agent: name``. Every agent's networks are member-batched (seed ``n``'s ``k`` members of a
network are members ``n·k … n·k + k − 1``), and every agent trains them with the update engine
(:mod:`~sac_spectral.agents.engine`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from sac_spectral.agents.engine import Trained
from sac_spectral.agents.replay import ReplayBuffer
from sac_spectral.agents.steps import Draws, Metrics
from sac_spectral.core.config import ConfigError, check_section
from sac_spectral.core.nets import BatchedNetwork
from sac_spectral.core.plugins import OWNER, load_entry_points
from sac_spectral.core.seeding import SeedStreams


@runtime_checkable
class Agent(Protocol):
    """What the layers above an agent use. Tensors carry a leading seed axis ``N``."""

    name: ClassVar[str]
    #: the config sections the agent reads: those of the agents it extends, then its own (REDQ:
    #: ``alpha``, ``redq``); the options of any other section must keep their defaults in its runs
    sections: ClassVar[tuple[str, ...]]
    compiles: ClassVar[bool]
    #: what an update (and a diagnostics probe) draws per seed: name → shape of standard normals
    draws: Draws
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

    def reset(self, last: int | None = None, networks: Sequence[str] | None = None) -> None:
        """Re-draw the trained networks in ``networks`` (``None``: every one), whole (``last=None``) or
        their last ``last`` levels; the buffer stays."""

    def forget_optimizers(self) -> None:
        """Clear every trained network's optimizer state; the parameters stay."""

    def nets(self) -> dict[str, BatchedNetwork]:
        """The trained networks that regularizers, spectra and diagnostics see."""

    def per_seed(self, net: str, value: Tensor) -> Tensor:
        """Average a per-member ``[M]`` value of ``net`` over each seed's members."""

    @property
    def trained(self) -> dict[str, Trained]:
        """The trained networks by name: module, optimizer, regularizers, target, members per seed,
        their inputs and per-example losses (what regularizers, spectra and diagnostics see)."""

    def full_state_dict(self) -> dict[str, Any]: ...

    def load_full_state_dict(self, state: dict[str, Any]) -> None: ...

    @classmethod
    def networks(cls, members: int, obs_dim: int, act_dim: int, cfg: Any) -> dict[str, nn.Module]:
        """The trained networks of ``members`` seeds as built (for memory estimates), untrained."""

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """Refuse, in one ``ConfigError`` line, a config this agent cannot run as written (checked
        with the config, before anything is written)."""

    @classmethod
    def run_warnings(cls, cfg: Any) -> list[str]:
        """One line per thing a run of ``cfg`` would silently never do (told at the start, kept in
        the summary)."""

    @classmethod
    def memory_estimate(cls, cfg: Any, obs_dim: int, act_dim: int) -> dict[str, float]:
        """Bytes a run of ``cfg`` allocates, by part (for the check before anything is built)."""

    @classmethod
    def export_policy(cls, cfg: Any, actor_state: dict[str, Tensor]) -> nn.Module:
        """The acting policy from the checkpoint's actor weights: ``forward(obs [M, B, O], member,
        deterministic, generator) → member's actions [B, A]`` in ``[-1, 1]`` (what ``load_policy``
        runs; every member sees the batch, as in the trainer's batched act), with the actor network
        as its ``actor`` (on which ``load_policy`` rebuilds the actor's regularizers)."""


def actor_dims(actor_state: dict[str, Tensor]) -> tuple[int, int, int]:
    """``(members, obs_dim, act_dim)`` of an actor's state dict: its input statistics ``[M, obs]``
    where it keeps them, else its first weight ``[M, out, obs]``, and its first head's last weight
    ``[M, act, ·]``; a ``KeyError`` / ``StopIteration`` where it has neither."""
    first = next(v for k, v in actor_state.items() if k.endswith("weight") and v.dim() == 3)
    obs = actor_state["input_norm.mean"].shape[1] if "input_norm.mean" in actor_state else first.shape[2]
    head = [v for k, v in actor_state.items() if k.startswith("heads.0.") and k.endswith("weight") and v.dim() == 3]
    return first.shape[0], obs, head[-1].shape[1] if head else actor_state["heads.0.weight"].shape[1]


AGENTS: dict[str, type] = {}
#: each agent's own config section: ``{key: (section class, help)}`` (SAC's ``alpha``, TD3's ``td3``, …)
SECTIONS: dict[str, tuple[type, str]] = {}
#: the run config's keys (:func:`reserve_run_keys`), which no section may take
RUN_KEYS: set[str] = set()
#: the entry-point group through which installed packages add agents
GROUP = "sac_spectral.agents"
_broken: dict[str, str] | None = None


def register_agent(name: str, config: type | None = None, section: str | None = None) -> Callable[[type], type]:
    """Class decorator: make the agent selectable as ``agent: name`` in run configs, with its own
    options ``config`` (a config dataclass) under the top-level key ``section`` (default: ``name``),
    which every RL config then accepts and ``--help`` lists. A ``ValueError`` refuses options that a
    run config could not hold (a run key's or another section's name, an option without a default or
    of a type the config cannot parse, defaults that ``validate()`` rejects): a plug-in's is then
    broken, and costs only itself."""

    def wrap(cls: type) -> type:
        if name in AGENTS and AGENTS[name] is not cls:
            raise ValueError(f"agent '{name}' is already registered ({AGENTS[name].__qualname__})")
        key = section or name
        if config is not None:
            _check_section(key, config)
        cls.name = name
        cls.sections = tuple(dict.fromkeys([*getattr(cls, "sections", ()), *([key] if config is not None else [])]))
        AGENTS[name] = cls
        if config is not None:
            SECTIONS[key] = (config, f"{name}'s own options (agent: {name})")
        return cls

    return wrap


def reserve_run_keys(keys: Iterable[str]) -> None:
    """The run config's own keys (its module declares them when imported), which no agent's section
    may take; a section registered earlier under one of them is refused now."""
    RUN_KEYS.update(keys)
    for key in RUN_KEYS & SECTIONS.keys():
        _refuse_run_key(key)


def _refuse_run_key(key: str) -> None:
    raise ValueError(f"config section '{key}' would replace the run config's key '{key}'; "
                     "name the section otherwise (register_agent(..., section=...))")


def _check_section(key: str, config: type) -> None:
    """Refuse an agent's options that no run config could hold: under a key of the run config or of
    another section, or options that :func:`~sac_spectral.core.config.check_section` refuses."""
    if key in RUN_KEYS:
        _refuse_run_key(key)
    if key in SECTIONS and SECTIONS[key][0] is not config:
        raise ValueError(f"config section '{key}' is already registered ({SECTIONS[key][0].__qualname__})")
    check_section(config, key)


def _register_plugin(name: str, obj: Any) -> None:
    """An entry point of :data:`GROUP`: an agent class, registered by its decorator or here."""
    if not isinstance(obj, type) or not hasattr(obj, "steps"):
        raise TypeError(f"expected an agent class, got {type(obj).__name__}")
    if AGENTS.get(name) is not obj:
        register_agent(name)(obj)


def _holder(cls: type) -> str:
    """``the built-in sac_spectral.agents.sac:SAC``, or ``the agent mod:Cls`` some code registered."""
    where = f"{cls.__module__}:{cls.__qualname__}"
    return f"the built-in {where}" if cls.__module__.startswith(f"{OWNER}.") else f"the agent {where}"


def discover_agents() -> dict[str, str]:
    """Load the agents that installed packages declare in :data:`GROUP` (once): the names already
    registered (the built-ins) keep their agents, and a plug-in that names one is not imported; a
    broken or ignored plug-in costs one warning line. Returns the broken ones' names with the reason."""
    global _broken
    if _broken is None:
        _broken = load_entry_points(GROUP, _register_plugin, {name: _holder(cls) for name, cls in AGENTS.items()})
    return _broken


def agent_sections() -> dict[str, tuple[type, str]]:
    """Every registered agent's own config section (installed packages' agents included)."""
    discover_agents()
    return SECTIONS


def agent_choices() -> str:
    """The ``agent`` key's help: the built-in agents, then the others registered (installed plug-ins,
    or agents your code registers)."""
    discover_agents()
    built_in = [name for name, cls in AGENTS.items() if cls.__module__.startswith(f"{OWNER}.")]
    others = [name for name in AGENTS if name not in built_in]
    added = f"; plug-ins: {', '.join(others)}" if others else f"; no plug-ins installed (entry-point group {GROUP})"
    return f"the agent: {', '.join(built_in)} (built in){added}"


def agent_class(name: str) -> type:
    """The registered agent ``name``; a one-line :class:`ConfigError` naming the choices otherwise."""
    broken = discover_agents()
    if name in broken:
        raise ConfigError(f"agent: '{name}' is unavailable: {broken[name]}")
    if name not in AGENTS:
        raise ConfigError(f"agent: unknown agent '{name}'; choose one of {', '.join(sorted(AGENTS))}")
    return AGENTS[name]


def build_agent(obs_dim: int, act_dim: int, cfg: Any, streams: SeedStreams,
                device: str | torch.device = "cpu") -> Agent:
    """The agent ``cfg.agent`` names, for ``len(streams)`` seeds."""
    return agent_class(cfg.agent)(obs_dim, act_dim, cfg, streams, device)
