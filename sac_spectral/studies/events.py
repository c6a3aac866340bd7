"""The last value of TensorBoard scalars in a run directory, per seed: what ``report --diagnostics``
tabulates (a run logs a multi-seed run's seed ``i`` under ``seed<i>/<tag>`` and the mean under
``<tag>``, a one-seed run under ``<tag>``)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator


@lru_cache(maxsize=256)
def _scalars(run_dir: Path) -> dict[str, float]:
    """Every scalar tag of ``run_dir``'s event files with its value at the largest step."""
    acc = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: max(acc.Scalars(tag), key=lambda e: (e.step, e.wall_time)).value for tag in acc.Tags()[SCALARS]}


def final_values(run_dir: Path, tags: Sequence[str], seed_index: int) -> dict[str, float]:
    """The last logged value of each of ``tags`` for seed ``seed_index`` of the run (tags it never
    logged are left out)."""
    logged = _scalars(Path(run_dir).resolve())
    out = {}
    for tag in tags:
        for name in (f"seed{seed_index}/{tag}", tag):
            if name in logged:
                out[tag] = logged[name]
                break
    return out


def logged_tags(run_dir: Path) -> list[str]:
    """The scalar tags of a run, per-seed prefixes dropped."""
    return sorted({t.split("/", 1)[1] if t.startswith("seed") and t.split("/", 1)[0][4:].isdigit() else t
                   for t in _scalars(Path(run_dir).resolve())})
