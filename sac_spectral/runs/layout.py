"""The files of a run directory, for every writer and reader of one (no torch: the report reads it).

A run directory holds TensorBoard event files, the resolved ``config.yaml``,
``checkpoints/latest.pt``, ``evals.csv`` and, when the run completes, ``summary.json``. The
checkpoint and ``summary.json`` record the run's kind (:data:`RUN_KINDS`); ``config.yaml`` holds
only the config, so that it stays a valid ``--config`` file and the source of ``--resume``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.yaml"
CHECKPOINT = Path("checkpoints") / "latest.pt"
SUMMARY = "summary.json"

#: the kinds of run: an RL run of ``sac_spectral.train``, a continual run of ``sac_spectral.continual``
RUN_KINDS = ("train", "continual")

#: tasks averaged in a continual run's summary windows (its first and last ``SUMMARY_TASKS`` tasks)
SUMMARY_TASKS = 5


def run_kind(config: Mapping[str, Any], record: Any = None) -> str:
    """The kind ``record`` (a run's checkpoint or ``summary.json``) names; without one (a run in
    progress has no summary, and older runs recorded no kind) the kind its contents imply: an RL
    run's config names an ``env`` and its checkpoint holds an ``agent``, a continual run's neither."""
    record = record if isinstance(record, Mapping) else {}
    kind = record.get("kind")
    if kind in RUN_KINDS:
        return kind
    return "train" if "env" in config or "agent" in record else "continual"


def dir_kind(run_dir: Path, config: Mapping[str, Any]) -> str:
    """The kind of the run in ``run_dir`` whose ``config.yaml`` holds ``config`` (see :func:`run_kind`);
    a missing or unreadable ``summary.json`` records nothing."""
    try:
        summary = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        summary = None
    return run_kind(config, summary)
