"""Continual-RL measures of a task sequence's evaluations (no torch here: the report reads it).

From the evaluation rows of a run (``evals.csv``: ``step``, ``seed``, ``task``, ``stage``,
``return``, ``updates``, ``warmup``) and its stages' tasks, per task and seed:

- ``final``: the return at the run's last evaluation;
- ``best_per_stage``: the best return the task reached in each stage it was evaluated in;
- ``forgetting``: the best return before the end minus the final one (positive: forgotten);
- ``first``: the return at the end of the task's first stage (what it learned when it was new);
- ``plasticity``: per later stage of a task, the return at that stage's end divided by the return
  at the end of the task's first stage (both after ``steps_per_task`` steps of it): below 1, the
  agent learns the task less well than it did when it was new (a loss of plasticity);
- ``warmup_steps``: the steps of its evaluations in a stage's warm-up;

and per stage ``s`` and seed, ``stage_end[s]``: the return of the stage's own task at the stage's
end (after ``steps_per_task`` steps of it), what the report divides by a fresh-network
reference's (``reset_all``: the same stages learned by networks re-initialized at every switch).

An evaluation in a stage's warm-up (before the stage's first update, e.g. the random-action steps
after a cleared buffer) scores the networks the stage before left: it counts for ``final`` only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Rows = Iterable[Mapping[str, Any]]


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept and len(kept) == len(values) else None


def in_warmup(rows: Rows, steps_per_task: int) -> list[tuple[Mapping[str, Any], bool]]:
    """Each row with whether it is in a stage's warm-up: its ``warmup`` cell, or in files written
    before that column, whether its ``updates`` are those at its stage's start (0 in stage 0, those
    of the evaluations that ended the stage before in later ones; without ``updates``: no)."""
    rows = list(rows)
    ends = {(r["seed"], r["step"]): r["updates"] for r in rows if r.get("updates") is not None}
    out = []
    for r in rows:
        warm = r.get("warmup")
        if warm is None and r.get("updates") is not None and r.get("stage") is not None:
            start = 0 if int(r["stage"]) == 0 else ends.get((r["seed"], int(r["stage"]) * steps_per_task))
            warm = r["updates"] == start
        out.append((r, bool(warm)))
    return out


def stage_metrics(rows: Rows, stage_tasks: Sequence[str], steps_per_task: int, seeds: Sequence[int]) -> dict[str, Any]:
    """The measures above (per seed, ``None`` where not measured yet) for stages whose tasks are
    ``stage_tasks`` (stage ``s`` trains task ``stage_tasks[s]``), plus their averages over tasks
    per seed: ``final_average``, ``first_average``, ``forgetting_average`` and ``plasticity_by_stage``."""
    end = len(stage_tasks) * steps_per_task
    # (task, seed) -> step -> (stage, return, in a warm-up)
    returns: dict[tuple[str, int], dict[int, tuple[int, float, bool]]] = defaultdict(dict)
    for r, warm in in_warmup(rows, steps_per_task):
        if r.get("task") is not None and r.get("return") is not None:
            returns[(str(r["task"]), int(r["seed"]))][int(r["step"])] = (int(r["stage"]), float(r["return"]), warm)
    tasks: dict[str, dict[str, Any]] = {}
    by_stage: dict[str, list[float | None]] = {}
    for task in dict.fromkeys(stage_tasks):
        own = [s for s, t in enumerate(stage_tasks) if t == task]
        out: dict[str, Any] = {"final": [], "first": [], "forgetting": [], "best_per_stage": defaultdict(list),
                               "plasticity": defaultdict(list), "warmup_steps": set()}
        for seed in seeds:
            evals = returns.get((task, seed), {})
            final = evals[end][1] if end in evals else None
            trained = {step: (st, ret) for step, (st, ret, warm) in evals.items() if not warm}
            out["warmup_steps"] |= evals.keys() - trained.keys()
            earlier = [ret for step, (_, ret) in trained.items() if step < end]
            out["final"].append(final)
            out["forgetting"].append(max(earlier) - final if earlier and final is not None else None)
            for stage in sorted({st for st, _ in trained.values()}):
                out["best_per_stage"][str(stage)].append(max(ret for st, ret in trained.values() if st == stage))
            ends = [trained.get((s + 1) * steps_per_task, (None, None))[1] for s in own]
            out["first"].append(ends[0])
            for s, ret in zip(own[1:], ends[1:]):
                ratio = ret / ends[0] if ret is not None and ends[0] is not None and ends[0] > 0 else None
                out["plasticity"][str(s)].append(ratio)
        out["best_per_stage"], out["plasticity"] = dict(out["best_per_stage"]), dict(out["plasticity"])
        out["warmup_steps"] = sorted(out["warmup_steps"])
        by_stage.update(out["plasticity"])
        tasks[task] = out
    ends = {(task, seed, step): ret for (task, seed), evals in returns.items()
            for step, (_, ret, warm) in evals.items() if not warm}
    stage_end = {str(s): [ends.get((task, seed, (s + 1) * steps_per_task)) for seed in seeds]
                 for s, task in enumerate(stage_tasks)}
    per_seed = list(zip(*(t["final"] for t in tasks.values())))
    forgot = list(zip(*(t["forgetting"] for t in tasks.values())))
    first = list(zip(*(t["first"] for t in tasks.values())))
    return {
        "steps_per_task": steps_per_task, "stages": list(stage_tasks), "tasks": tasks,
        "final_average": [_mean(v) for v in per_seed], "forgetting_average": [_mean(v) for v in forgot],
        "first_average": [_mean(v) for v in first],
        "plasticity_by_stage": dict(sorted(by_stage.items(), key=lambda kv: int(kv[0]))),
        "seeds": list(seeds), "stage_end": stage_end,
    }
