"""Continual-RL measures of a task sequence's evaluations (no torch here: the report reads it).

From the evaluation rows of a run (``evals.csv``: ``step``, ``seed``, ``task``, ``stage``,
``return``) and its stages' tasks, per task and seed:

- ``final``: the return at the run's last evaluation;
- ``best_per_stage``: the best return the task reached in each stage it was evaluated in;
- ``forgetting``: the best return before the end minus the final one (positive: forgotten);
- ``first``: the return at the end of the task's first stage (what it learned when it was new);
- ``plasticity``: per later stage of a task, the return at that stage's end divided by the return
  at the end of the task's first stage (both after ``steps_per_task`` steps of it): below 1, the
  agent learns the task less well than it did when it was new (a loss of plasticity).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Rows = Iterable[Mapping[str, Any]]


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept and len(kept) == len(values) else None


def stage_metrics(rows: Rows, stage_tasks: Sequence[str], steps_per_task: int, seeds: Sequence[int]) -> dict[str, Any]:
    """The measures above (per seed, ``None`` where not measured yet) for stages whose tasks are
    ``stage_tasks`` (stage ``s`` trains task ``stage_tasks[s]``), plus their averages over tasks
    per seed: ``final_average``, ``first_average``, ``forgetting_average`` and ``plasticity_by_stage``."""
    end = len(stage_tasks) * steps_per_task
    returns: dict[tuple[str, int], dict[int, tuple[int, float]]] = defaultdict(dict)  # (task, seed) -> step -> (stage, return)
    for r in rows:
        if r.get("task") is not None and r.get("return") is not None:
            returns[(str(r["task"]), int(r["seed"]))][int(r["step"])] = (int(r["stage"]), float(r["return"]))
    tasks: dict[str, dict[str, Any]] = {}
    by_stage: dict[str, list[float | None]] = {}
    for task in dict.fromkeys(stage_tasks):
        own = [s for s, t in enumerate(stage_tasks) if t == task]
        out: dict[str, Any] = {"final": [], "first": [], "forgetting": [], "best_per_stage": defaultdict(list),
                               "plasticity": defaultdict(list)}
        for seed in seeds:
            evals = returns.get((task, seed), {})
            final = evals[end][1] if end in evals else None
            earlier = [ret for step, (_, ret) in evals.items() if step < end]
            out["final"].append(final)
            out["forgetting"].append(max(earlier) - final if earlier and final is not None else None)
            for stage in sorted({st for st, _ in evals.values()}):
                out["best_per_stage"][str(stage)].append(max(ret for st, ret in evals.values() if st == stage))
            ends = [evals.get((s + 1) * steps_per_task, (None, None))[1] for s in own]
            out["first"].append(ends[0])
            for s, ret in zip(own[1:], ends[1:]):
                ratio = ret / ends[0] if ret is not None and ends[0] is not None and ends[0] > 0 else None
                out["plasticity"][str(s)].append(ratio)
        out["best_per_stage"], out["plasticity"] = dict(out["best_per_stage"]), dict(out["plasticity"])
        by_stage.update(out["plasticity"])
        tasks[task] = out
    per_seed = list(zip(*(t["final"] for t in tasks.values())))
    forgot = list(zip(*(t["forgetting"] for t in tasks.values())))
    first = list(zip(*(t["first"] for t in tasks.values())))
    return {
        "steps_per_task": steps_per_task, "stages": list(stage_tasks), "tasks": tasks,
        "final_average": [_mean(v) for v in per_seed], "forgetting_average": [_mean(v) for v in forgot],
        "first_average": [_mean(v) for v in first],
        "plasticity_by_stage": dict(sorted(by_stage.items(), key=lambda kv: int(kv[0]))),
    }
