"""Run kinds: what sweeps, reports and trial checks need to know about the runs a runner writes,
declared by the runner itself (no torch here: the report reads it).

A runner declares one :class:`RunKind` in a module of its own that does not import torch, and
registers it in its distribution's metadata, in the entry-point group ``sac_spectral.run_kinds``
(``pyproject.toml``)::

    [project.entry-points."sac_spectral.run_kinds"]
    train = "sac_spectral.apps.rl.kind:KIND"

:func:`get_kind` finds every kind so declared by any installed distribution (this package's own
``train`` and ``continual``, or a user's), and :func:`register_kind` adds one in-process (a notebook
or a test). Nothing in this layer names a runner. A plug-in that fails to load, or declares a
built-in's name, is skipped with a warning (:func:`~sac_spectral.core.plugins.load_entry_points`);
only asking for a broken plug-in's kind is an error, which says why.

Every run records its kind: in the first line of ``config.yaml`` (a YAML comment, so the file stays
a valid ``--config``), in its checkpoint and in ``summary.json``. :func:`run_kind` reads it; runs
written before kinds were recorded are told apart by their keys (the one fallback).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sac_spectral.core.config import ConfigError
from sac_spectral.core.plugins import load_entry_points
from sac_spectral.runs.layout import CONFIG_FILE, SUMMARY

GROUP = "sac_spectral.run_kinds"
#: the first line of ``config.yaml``: ``# kind: <name>`` (followed by a description)
KIND_LINE = re.compile(r"^# kind: ([A-Za-z0-9_.-]+)")

Row = dict[str, Any]


@dataclass(frozen=True)
class RunKind:
    """A kind of run, as the layers above its runner see it.

    The run's ``evals.csv`` has ``columns``; ``x`` orders its evaluations and ``score`` is what a
    report aggregates, divided by ``scale(config)`` (``None``: not normalized) and named
    ``score_label`` (``raw_label`` when not normalized), beside a held-out score ``test`` where the
    kind has one (``None``: none), the final score being the mean of the last
    ``window`` evaluations (``window > 1`` also gets the report's first-vs-last window comparison
    and its per-evaluation figure). ``config`` and ``cost`` name (``module:attribute``, imported only
    when needed, as they bring torch) the run config class and the dry run's cost function
    ``cost(cfg, model) -> (units, seconds)`` (``model``: :class:`~sac_spectral.studies.cost.CostModel`).
    ``curve_rows(rows, config)`` keeps the rows a run's curve is made of (an RL task sequence's: the
    task each stage trains, where every task is evaluated at a switch); ``stages(rows, config)``
    measures a task sequence per seed (final return over tasks, forgetting, plasticity per stage:
    :func:`~sac_spectral.apps.rl.stages.stage_metrics`), ``None`` for other runs.
    """

    name: str
    runner: str
    title: str
    config: str
    cost: str
    unit: str
    columns: tuple[str, ...]
    x: str
    x_label: str
    score: str
    score_label: str
    raw_label: str
    test: str | None
    task_keys: tuple[str, ...]
    window: int
    members: bool
    scale: Callable[[Mapping[str, Any]], float | None]
    history: Callable[[Mapping[str, Any]], list[Row]]
    names_run: Callable[[Mapping[str, Any], Mapping[str, Any]], bool]
    curve_rows: Callable[[list[Row], Mapping[str, Any]], list[Row]] = lambda rows, config: rows
    stages: Callable[[list[Row], Mapping[str, Any]], dict[str, Any] | None] = lambda rows, config: None

    def load(self, attribute: str) -> Any:
        """The object that ``config`` or ``cost`` names."""
        module, _, name = getattr(self, attribute).partition(":")
        return getattr(importlib.import_module(module), name)

    def normalized(self, config: Mapping[str, Any]) -> bool:
        """Whether the scores of a run of ``config`` are normalized (comparable across tasks)."""
        return self.scale(config) is not None


_KINDS: dict[str, RunKind] = {}
#: kinds whose plug-in failed to load: name -> why
_BROKEN: dict[str, str] = {}
_discovered = False


def register_kind(kind: RunKind) -> RunKind:
    """Make ``kind`` known in this process (an installed runner registers through its entry point)."""
    if not isinstance(kind, RunKind):
        raise TypeError(f"register_kind expects a RunKind, got {type(kind).__name__}")
    _KINDS[kind.name] = kind
    return kind


def _register_declared(name: str, kind: Any) -> None:
    """Register the kind that the entry point ``name`` declares; a kind registered in-process keeps its name."""
    if isinstance(kind, RunKind) and kind.name != name:
        raise ValueError(f"its RunKind is named '{kind.name}', not '{name}'")
    if name not in _KINDS:
        register_kind(kind)


def _discover() -> None:
    global _discovered
    if not _discovered:
        _discovered = True
        _BROKEN.update(load_entry_points(GROUP, _register_declared))


def kind_names() -> list[str]:
    """Every known kind."""
    _discover()
    return sorted(_KINDS)


def unknown_kind(name: str) -> str:
    """Why no kind is called ``name``: its plug-in's failure, or the known kinds."""
    _discover()
    if name in _BROKEN:
        return f"'{name}' is unavailable: {_BROKEN[name]}"
    if not _KINDS:
        return f"'{name}' is unknown: no run kind is installed (is the package installed?)"
    return f"'{name}' is not one of {', '.join(sorted(_KINDS))}"


def get_kind(name: str) -> RunKind:
    """The kind called ``name``; an unknown or broken one is a one-line error saying why."""
    _discover()
    if name not in _KINDS:
        raise ConfigError(f"run kind {unknown_kind(name)}")
    return _KINDS[name]


def config_header(kind: str) -> str:
    """The comment line that opens a run's ``config.yaml``."""
    return f"# kind: {kind} (the resolved config of this run; usable as --config)\n"


def _legacy_kind(config: Mapping[str, Any], record: Mapping[str, Any]) -> str:
    """The kind of a run written before kinds were recorded: an RL run's config names an ``env`` and
    its checkpoint holds an ``agent``, a continual run's neither."""
    return "train" if "env" in config or "agent" in record else "continual"


def run_kind(config: Mapping[str, Any], record: Any = None, header: str = "") -> str:
    """The kind that ``record`` (a run's checkpoint or ``summary.json``) or ``header`` (the first line
    of its ``config.yaml``) names; for runs that recorded none, :func:`_legacy_kind`."""
    record = record if isinstance(record, Mapping) else {}
    if isinstance(record.get("kind"), str):
        return record["kind"]
    match = KIND_LINE.match(header)
    return match.group(1) if match else _legacy_kind(config, record)


def dir_kind(run_dir: Path, config: Mapping[str, Any]) -> str:
    """The kind of the run in ``run_dir`` whose ``config.yaml`` holds ``config``."""
    try:
        summary = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        summary = None
    try:
        with (run_dir / CONFIG_FILE).open() as f:
            header = f.readline()
    except (OSError, UnicodeDecodeError):
        header = ""
    return run_kind(config, summary, header)
