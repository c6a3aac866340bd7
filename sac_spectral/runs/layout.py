"""The files of a run directory, for every writer and reader of one (no torch: the report reads it).

A run directory holds TensorBoard event files, the resolved ``config.yaml``,
``checkpoints/latest.pt``, ``evals.csv``, ``videos/`` (RL runs with ``video_every``) and, when the
run completes, ``summary.json``. ``config.yaml``, the checkpoint and ``summary.json`` record the
run's kind (:mod:`sac_spectral.runs.kinds`); ``config.yaml`` holds only the config below that
comment line, so that it stays a valid ``--config`` file and the source of ``--resume``. :func:`written_by_a_run` says
which files a run stopped before its first checkpoint may have left (the runners restart such a run, a sweep removes
it).
"""

from __future__ import annotations

import re
from pathlib import Path

CONFIG_FILE = "config.yaml"
CHECKPOINT = Path("checkpoints") / "latest.pt"
SUMMARY = "summary.json"
EVALS = "evals.csv"
#: what ``python -m sac_spectral.diagnose RUN --q-scale N --json RUN/mechanism.json`` writes: the report's mechanism
#: section reads it (a run itself never writes it)
MECHANISM = "mechanism.json"
VIDEOS = "videos"
#: the start of a TensorBoard event file's name
EVENTS = "events.out.tfevents."
#: the temporary file of an atomic write of a run's file, left by a kill during it
#: (``.latest.pt.<id>.tmp``, ``.config.yaml.<id>.tmp``, ``.evals.csv.tmp``, …)
TEMP_FILE = re.compile(r"^\.(latest\.pt|config\.yaml|summary\.json|evals\.csv)(\..+)?\.tmp$")
#: a video of ``video_every`` in ``videos/`` (``step_<step>.mp4`` or ``.gif``) or its temporary file
VIDEO_FILE = re.compile(r"^(step_\d+\.(mp4|gif)|\.step_\d+\.(mp4\..+\.mp4|gif\..+\.tmp))$")

def written_by_a_run(run_dir: Path) -> bool:
    """``run_dir`` holds nothing but what a run writes before its first checkpoint: its
    ``config.yaml``, TensorBoard events, ``evals.csv``, videos and temporary files of atomic writes
    (in ``checkpoints/`` only those)."""
    allowed = {CHECKPOINT.parent.name: TEMP_FILE, VIDEOS: VIDEO_FILE}
    for p in run_dir.iterdir():
        if p.name in allowed and p.is_dir():
            if any(not (q.is_file() and allowed[p.name].match(q.name)) for q in p.iterdir()):
                return False
        elif not (p.is_file() and (p.name in (CONFIG_FILE,
                                              EVALS) or p.name.startswith(EVENTS) or TEMP_FILE.match(p.name))):
            return False
    return True
