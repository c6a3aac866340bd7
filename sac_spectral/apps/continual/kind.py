"""The run kind of ``python -m sac_spectral.continual`` (:class:`~sac_spectral.runs.kinds.RunKind`;
no torch here: the report reads it). Registered through the entry point ``continual`` of the group
``sac_spectral.run_kinds``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sac_spectral.runs.kinds import Row, RunKind

#: ``evals.csv``: one row per task end (an empty cell: not measured, e.g. no test set)
COLUMNS = ("task", "iteration", "seed", "train_acc", "test_acc", "loss", "test_loss", "wall_time_s")
#: tasks averaged in a continual run's summary windows (its first and last ``SUMMARY_TASKS`` tasks)
SUMMARY_TASKS = 5


def scale(config: Mapping[str, Any]) -> float:
    """Accuracies are already in [0, 1]."""
    return 1.0


def history(summary: Mapping[str, Any]) -> list[Row]:
    """The task ends in a ``summary.json`` (runs written before ``evals.csv``)."""
    return [{**t, "seed": summary.get("seed")} for t in summary["tasks"]]


def names_run(summary: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """``summary`` is that of the run of ``config``: the same seed and stream."""
    stream = config.get("stream")
    return (summary.get("seed") == config.get("seed") and isinstance(stream, dict)
            and summary.get("stream") == stream.get("kind"))


KIND = RunKind(
    name="continual", runner="sac_spectral.continual", title="continual (sac_spectral.continual)",
    config="sac_spectral.apps.continual.runner:ContinualConfig", cost="sac_spectral.apps.continual.cost:estimate_cost",
    unit="iterations",
    columns=COLUMNS, x="task", x_label="task", score="train_acc",
    score_label="end-of-task training accuracy", raw_label="end-of-task training accuracy", test="test_acc",
    task_keys=("dataset.name", "stream.kind"), window=SUMMARY_TASKS, members=False, scale=scale, history=history,
    names_run=names_run,
)
