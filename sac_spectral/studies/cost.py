"""The dry run of a sweep: every trial with its state and estimated cost, measured here by its run
kind's cost function (:attr:`RunKind.cost <sac_spectral.runs.kinds.RunKind>`: RL trials time the
agent's update and an env step, continual ones the learner's step), through a :class:`CostModel`."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from sac_spectral.core.config import merge_sources
from sac_spectral.runs.kinds import get_kind
from sac_spectral.studies.spec import Sweep, invalid_trials
from sac_spectral.studies.status import Status, read_status
from sac_spectral.studies.trial import trial_state


class CostModel:
    """What the kinds' cost functions measure with: the trial's thread count, a median timer and a
    cache, so that trials which differ only in seeds or length are timed once."""

    def __init__(self, threads: int) -> None:
        self.threads, self.cache = threads, {}

    @staticmethod
    def measure(fn: Any, repeats: int = 3) -> float:
        """The median wall time of ``repeats`` calls of ``fn``."""
        samples = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
        return statistics.median(samples)

    def cached(self, key: Any, fn: Any) -> Any:
        """``fn()``, measured once per ``key`` (a JSON-able description of what it times)."""
        key = json.dumps(key, sort_keys=True, default=str)
        if key not in self.cache:
            self.cache[key] = fn()
        return self.cache[key]


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def dry_run(sweep: Sweep, root: Path, retry_failed: bool, num_cpus: int | None) -> int:
    """List the trials with their state and estimated cost; starts nothing, writes nothing."""
    import torch

    kind = get_kind(sweep.cfg.kind)
    cls, cost = kind.load("config"), kind.load("cost")
    res = sweep.cfg.resources_per_trial
    status, invalid = Status(sweep, root, read_status(root)), invalid_trials(sweep)
    device = "cuda" if res.gpu and torch.cuda.is_available() else "cpu"
    model = CostModel(res.cpu)
    unit = kind.unit
    width = max(len(t.id) for t in sweep.trials)
    print(f"{'trial':<{width}}  {'state':<8} {unit:>12}  {'estimate':>9}  note")
    total_updates, total_s, n_run = 0, 0.0, 0
    for t in sweep.trials:
        entry = status.trials[t.id]
        if t.id in invalid:
            print(f"{t.id:<{width}}  {'invalid':<8} {'':>12}  {'':>9}  {invalid[t.id]}")
            continue
        state = "resume" if entry["status"] == "pending" and trial_state(root / t.id) == "resume" else entry["status"]
        cfg = merge_sources(cls, sweep.base, [*t.overrides, f"threads={res.cpu}", f"device={device}"])
        updates, seconds = cost(cfg, model)
        if entry["status"] == "pending" or (retry_failed and entry["status"] == "failed"):
            total_updates, total_s, n_run = total_updates + updates, total_s + seconds, n_run + 1
        note = entry["error"] if entry["status"] == "failed" else ""
        print(f"{t.id:<{width}}  {state:<8} {updates:>12,}  {_duration(seconds):>9}  {note}")
    slots = max(1, (num_cpus or os.cpu_count() or 1) // res.cpu)
    print(f"\n{n_run} of {len(sweep.trials)} trials to run ({len(invalid)} invalid): {total_updates:,} {unit}, "
          f"≈ {_duration(total_s)} of trial time ({unit} and env steps timed here on {device} with {res.cpu} "
          f"thread(s); process start-up not counted), ≈ {_duration(total_s / min(slots, max(n_run, 1)))} "
          f"with {slots} trial(s) at a time on this machine")
    return 0
