"""The files of a run directory, for every writer and reader of one (no torch: the report reads it).

A run directory holds TensorBoard event files, the resolved ``config.yaml``,
``checkpoints/latest.pt``, ``evals.csv``, ``videos/`` (RL runs with ``video_every``) and, when the
run completes, ``summary.json``. The checkpoint and ``summary.json`` record the run's kind
(:data:`RUN_KINDS`); ``config.yaml`` holds only the config, so that it stays a valid ``--config``
file and the source of ``--resume``. :func:`written_by_a_run` says which files a run stopped
before its first checkpoint may have left (the runners restart such a run, a sweep removes it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.yaml"
CHECKPOINT = Path("checkpoints") / "latest.pt"
SUMMARY = "summary.json"
EVALS = "evals.csv"
VIDEOS = "videos"
#: the start of a TensorBoard event file's name
EVENTS = "events.out.tfevents."
#: the temporary file of an atomic write of a run's file, left by a kill during it
#: (``.latest.pt.<id>.tmp``, ``.config.yaml.<id>.tmp``, ``.evals.csv.tmp``, …)
TEMP_FILE = re.compile(r"^\.(latest\.pt|config\.yaml|summary\.json|evals\.csv)(\..+)?\.tmp$")
#: a video of ``video_every`` in ``videos/`` (``step_<step>.mp4`` or ``.gif``) or its temporary file
VIDEO_FILE = re.compile(r"^(step_\d+\.(mp4|gif)|\.step_\d+\.(mp4\..+\.mp4|gif\..+\.tmp))$")

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


def written_by_a_run(run_dir: Path) -> bool:
    """``run_dir`` holds nothing but what a run writes before its first checkpoint: its
    ``config.yaml``, TensorBoard events, ``evals.csv``, videos and temporary files of atomic writes
    (in ``checkpoints/`` only those)."""
    allowed = {CHECKPOINT.parent.name: TEMP_FILE, VIDEOS: VIDEO_FILE}
    for p in run_dir.iterdir():
        if p.name in allowed and p.is_dir():
            if any(not (q.is_file() and allowed[p.name].match(q.name)) for q in p.iterdir()):
                return False
        elif not (p.is_file() and (p.name in (CONFIG_FILE, EVALS) or p.name.startswith(EVENTS) or TEMP_FILE.match(p.name))):
            return False
    return True
