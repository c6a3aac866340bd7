"""The files of a run directory, for every writer and reader of one (no torch: the report reads it).

A run directory holds TensorBoard event files, the resolved ``config.yaml``,
``checkpoints/latest.pt``, ``evals.csv`` and, when the run completes, ``summary.json``.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_FILE = "config.yaml"
CHECKPOINT = Path("checkpoints") / "latest.pt"
SUMMARY = "summary.json"

#: tasks averaged in a continual run's summary windows (its first and last ``SUMMARY_TASKS`` tasks)
SUMMARY_TASKS = 5
