"""TensorBoard scalars of a run directory, per seed: what ``report --diagnostics`` and the report's
mechanism section tabulate (a run logs a multi-seed run's seed ``i`` under ``seed<i>/<tag>`` and the
mean under ``<tag>``, a one-seed run under ``<tag>``)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator


@lru_cache(maxsize=256)
def _series(run_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar tag of ``run_dir``'s event files: step → value (a step logged twice, by a resumed
    run, keeps its latest write)."""
    acc = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in sorted(acc.Scalars(tag), key=lambda e: (e.step, e.wall_time))}
            for tag in acc.Tags()[SCALARS]}


def _seed_tag(logged: dict[str, dict[int, float]], tag: str, seed_index: int) -> str | None:
    return next((name for name in (f"seed{seed_index}/{tag}", tag) if name in logged), None)


def final_values(run_dir: Path, tags: Sequence[str], seed_index: int) -> dict[str, float]:
    """The last logged value of each of ``tags`` for seed ``seed_index`` of the run (tags it never
    logged are left out)."""
    logged = _series(Path(run_dir).resolve())
    out = {}
    for tag in tags:
        name = _seed_tag(logged, tag, seed_index)
        if name is not None:
            out[tag] = logged[name][max(logged[name])]
    return out


def series(run_dir: Path, tag: str, seed_index: int) -> dict[int, float]:
    """Seed ``seed_index``'s values of ``tag``, step → value (empty if the run never logged it)."""
    logged = _series(Path(run_dir).resolve())
    name = _seed_tag(logged, tag, seed_index)
    return dict(logged[name]) if name is not None else {}


def last_in(run_dir: Path, tag: str, seed_index: int, start: int, end: int) -> float | None:
    """Seed ``seed_index``'s last value of ``tag`` logged after step ``start`` and at or before
    ``end`` (None if there is none)."""
    logged = series(run_dir, tag, seed_index)
    steps = [s for s in logged if start < s <= end]
    return logged[max(steps)] if steps else None


def logged_tags(run_dir: Path) -> list[str]:
    """The scalar tags of a run, per-seed prefixes dropped."""
    return sorted({t.split("/", 1)[1] if t.startswith("seed") and t.split("/", 1)[0][4:].isdigit() else t
                   for t in _series(Path(run_dir).resolve())})
