"""The run kind of ``python -m sac_spectral.train`` (:class:`~sac_spectral.runs.kinds.RunKind`;
no torch here: the report reads it). Registered through the entry point ``train`` of the group
``sac_spectral.run_kinds``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sac_spectral.apps.rl.stages import stage_metrics
from sac_spectral.runs.kinds import Row, RunKind

#: ``evals.csv``: one row per seed and evaluation, the mean return over ``episodes`` episodes of
#: ``task`` (a plain run's env; a sequence's task name) in training stage ``stage`` (0 in a plain run);
#: ``warmup`` 1 where the stage had no update yet (its warm-up; empty in files written before)
COLUMNS = ("step", "seed", "updates", "return", "episodes", "wall_time_s", "task", "stage", "warmup")


def scale(config: Mapping[str, Any]) -> float | None:
    """DMC returns lie in [0, 1000] and are divided by 1000; other envs' returns are not normalized."""
    return 1000.0 if str(config.get("env", "")).startswith(("dmc:", "dm_control/")) else None


def history(summary: Mapping[str, Any]) -> list[Row]:
    """The evaluations in a ``summary.json`` (runs written before ``evals.csv``)."""
    seeds = summary.get("seeds") or [summary.get("seed")]
    return [{"step": e["step"], "seed": s, "return": r} for e in summary["eval_history"] for s,
            r in zip(seeds, e["returns"])]


def names_run(summary: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """``summary`` is that of the run of ``config``: the same env and seeds."""
    seed = config.get("seed")
    seeds = list(range(seed, seed + config.get("num_seeds", 1))) if isinstance(seed, int) else None
    return summary.get("env") == config.get("env") and summary.get("seeds") == seeds


def current_task(rows: list[Row], config: Mapping[str, Any]) -> list[Row]:
    """A task sequence's evaluations of the task each stage trains (a plain run's rows as they are)."""
    names = [t.get("name") for t in config.get("tasks") or []]
    if not names:
        return rows
    return [r for r in rows if r.get("stage") is not None and r.get("task") == names[int(r["stage"]) % len(names)]]


def sequence_measures(rows: list[Row], config: Mapping[str, Any]) -> dict[str, Any] | None:
    """:func:`~sac_spectral.apps.rl.stages.stage_metrics` of a task sequence's rows, else None."""
    names = [t.get("name") for t in config.get("tasks") or []]
    if not names:
        return None
    seeds = sorted({int(r["seed"]) for r in rows})
    return stage_metrics(rows, names * int(config.get("cycles", 1)), int(config["steps_per_task"]), seeds)


KIND = RunKind(
    name="train", runner="sac_spectral.train", title="RL (sac_spectral.train)",
    config="sac_spectral.apps.rl.config:TrainConfig", cost="sac_spectral.apps.rl.cost:estimate_cost", unit="updates",
    columns=COLUMNS, x="step", x_label="env steps", score="return",
    score_label="return / 1000 (DMC)", raw_label="return (not normalized: a non-DMC task)", test=None,
    task_keys=("env",), window=1, members=True, scale=scale, history=history, names_run=names_run,
    curve_rows=current_task, stages=sequence_measures,
)
