"""The report's continual-RL part: runs of task sequences measured per seed by their kind's
``stages`` (RL: :func:`~sac_spectral.apps.rl.stages.stage_metrics`) — the final return averaged over the sequence's
tasks, forgetting and plasticity per stage — tabulated as IQMs with 95 % stratified-bootstrap CIs,
and each task's curve over the whole run with the stages and their warm-ups marked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sac_spectral.runs.evals import read_evals
from sac_spectral.runs.layout import CONFIG_FILE
from sac_spectral.studies.figures import Stages, mark_stages, stages_width
from sac_spectral.studies.results import (
    Pairs,
    Study,
    add_pair,
    correlation_table,
    headline_diagnostics,
    read_mapping,
    read_summary,
)

#: ``estimate(scores, func)``: point and 95 % interval per key of ``scores`` ([runs, 1] arrays)
Estimate = Callable[[dict[str, np.ndarray], Callable[[np.ndarray], np.ndarray]], tuple[dict, dict]]


@dataclass
class Sequences:
    """Per method, what its sequence runs measured (scores divided by the kind's scale)."""

    final: dict[str, list[float]] = field(default_factory=dict)
    first: dict[str, list[float]] = field(default_factory=dict)
    forgetting: dict[str, list[float]] = field(default_factory=dict)
    plasticity: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    #: method -> (run, seed) -> stage -> the stage's return at its end (scaled)
    stage_end: dict[str, dict[tuple[Path, int], dict[int, float]]] = field(default_factory=dict)
    #: method -> task -> (run, seed) -> step -> score
    curves: dict[str, dict[str, dict[tuple[Path, int], dict[int, float]]]] = field(default_factory=dict)
    #: method -> task -> the steps of its evaluations in a stage's warm-up
    warmups: dict[str, dict[str, set[int]]] = field(default_factory=dict)
    steps_per_task: int = 0
    stages: list[str] = field(default_factory=list)
    #: whether the runs follow different sequences (stages are then each run's own)
    mixed: bool = False

    @property
    def marks(self) -> Stages | None:
        """The stages the figures mark (none where the runs follow different sequences)."""
        return None if self.mixed or not self.stages else (self.stages, self.steps_per_task)


def read_sequences(study: Study) -> Sequences:
    """The task-sequence runs of ``study`` (those its kind's ``stages`` measures); empty where there
    are none."""
    out = Sequences()
    for method, run in dict.fromkeys((c.method, c.run) for c in study.curves):
        config = read_mapping(run / CONFIG_FILE)
        rows = read_evals(run)
        m = study.kind.stages(rows, config)
        if m is None:
            continue
        if out.stages and (out.stages, out.steps_per_task) != (m["stages"], m["steps_per_task"]):
            out.mixed = True
        out.steps_per_task, out.stages = m["steps_per_task"], m["stages"]
        scale = study.kind.scale(config) or 1.0
        out.final.setdefault(method, []).extend(v / scale for v in m["final_average"] if v is not None)
        out.forgetting.setdefault(method, []).extend(v / scale for v in m["forgetting_average"] if v is not None)
        out.first.setdefault(method, []).extend(v / scale for v in m["first_average"] if v is not None)
        for stage, values in m["plasticity_by_stage"].items():
            out.plasticity.setdefault(method, {}).setdefault(int(stage), []).extend(v for v in values if v is not None)
        for stage, values in m.get("stage_end", {}).items():
            for seed, value in zip(m["seeds"], values):
                if value is not None:
                    out.stage_end.setdefault(method, {}).setdefault((run, int(seed)), {})[int(stage)] = value / scale
        for task, measured in m.get("tasks", {}).items():  # a kind's stages may not mark warm-ups
            out.warmups.setdefault(method, {}).setdefault(task, set()).update(measured.get("warmup_steps", ()))
        score, x = study.kind.score, study.kind.x
        for r in rows:
            if r.get(score) is not None:
                by_task = out.curves.setdefault(method, {}).setdefault(str(r["task"]), {})
                curve = by_task.setdefault((run, int(r["seed"])), {})
                curve[int(r[x])] = float(r[score]) / scale
    return out


def _iqm(scores: np.ndarray) -> np.ndarray:
    from rliable import metrics

    return np.array([metrics.aggregate_iqm(scores)])


def _cell(values: list[float], point: dict, ci: dict, key: str) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3g} (1 seed, no CI)"
    return f"{float(point[key][0]):.3g} [{float(ci[key][0][0]):.3g}, {float(ci[key][1][0]):.3g}]"


def fresh_plasticity(seqs: Sequences, reference: str) -> dict[str, list[float]]:
    """Per method, one value per seed: the mean over the later stages (1, 2, …) of the method's
    stage-end return divided by ``reference``'s on the same seed and stage (the same tasks,
    permutations and dynamics: they are drawn from the seed and the stage). The reference learns
    every stage with fresh networks (``reset_all``), so below 1 a method learns a later stage less
    well than fresh networks do. Stages where the reference's return is not positive, and seeds the
    reference did not run, are left out; empty without the reference."""
    ref = {seed: ends for (_, seed), ends in seqs.stage_end.get(reference, {}).items()}
    out: dict[str, list[float]] = {}
    for method, runs in seqs.stage_end.items():
        for (_, seed), ends in runs.items():
            ratios = [v / ref[seed][s] for s, v in ends.items() if s > 0 and ref.get(seed, {}).get(s, 0) > 0]
            if ratios:
                out.setdefault(method, []).append(sum(ratios) / len(ratios))
    return out


def continual_section(seqs: Sequences, estimate: Estimate, data: dict[str, Any],
                      reference: str = "reset_all") -> list[str]:
    """The markdown table (and ``data["continual"]``) of every method's sequence runs; with a
    ``reference`` method among them, plasticity against its fresh networks (:func:`fresh_plasticity`)."""
    if not seqs.final and not seqs.forgetting:
        return []
    methods = list(dict.fromkeys([*seqs.final, *seqs.forgetting, *seqs.plasticity]))
    stages = sorted({s for m in methods for s in seqs.plasticity.get(m, {})})
    fresh = fresh_plasticity(seqs, reference)
    columns = {"final": seqs.final, "first": seqs.first, "forgetting": seqs.forgetting,
               **({"plasticity_vs_fresh": fresh} if fresh else {}),
               **{f"plasticity/{s}": {m: seqs.plasticity.get(m, {}).get(s, []) for m in methods} for s in stages}}
    estimates = {}
    for name, values in columns.items():
        arrays = {m: np.array(values.get(m, []), dtype=float).reshape(-1, 1)
                  for m in methods if len(values.get(m, [])) > 1}
        estimates[name] = estimate(arrays, _iqm) if arrays else ({}, {})
    header = ["final return, mean over tasks", "first stage's return", "forgetting"] + (
        [f"plasticity vs fresh networks (`{reference}`)"] if fresh else []) + [
        f"plasticity, stage {s}" + ("" if seqs.mixed else f" ({seqs.stages[s]})") for s in stages]
    lines = ["", "## Continual RL: final return, forgetting and plasticity", "",
             "Per seed: the final return averaged over the sequence's tasks; the return at the end of each "
             "task's first stage (what the method learns of a new task, its cost or gain there); forgetting, the best "
             "return "
             "before the end minus the final one, averaged over tasks; plasticity, a later stage's return at its end "
             "divided by the task's first stage's at its end (below 1: the agent learns the task less well than "
             f"when it was new), after {'its' if seqs.mixed else seqs.steps_per_task} steps each. An evaluation in a "
             "stage's "
             "warm-up (before the stage's first update: `warmup` in evals.csv) scores the networks the stage before "
             "left "
             "and counts in none of these but the final return. IQM over seeds with 95 % stratified-bootstrap CIs."
             + (f" Plasticity vs fresh networks: per seed, the mean over later stages of the stage's return at its end "
                f"divided by `{reference}`'s on the same seed and stage (the same tasks; fresh networks at every "
                "switch): "
                "below 1, the method learns a later stage less well than fresh networks do; it is the primary measure, "
                "since the ratio to one's own first stage is ill-conditioned where that stage fails." if fresh else "")
             + (" The runs follow different sequences: a stage is each run's own." if seqs.mixed else ""),
             "", "| method | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    data["continual"] = {}
    for m in methods:
        cells = [_cell(values.get(m, []), *estimates[name], m) for name, values in columns.items()]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
        data["continual"][m] = {name: {"values": values.get(m, []),
                                       "iqm": [float(estimates[name][0][m][0]),
                                               *map(float, estimates[name][1][m][:, 0])]
                                       if m in estimates[name][0] else None}
                                for name, values in columns.items()}
    return lines


def _at_switch(run: Path, switch: dict[str, Any], previous: int, seeds: int) -> dict[str, list[float]]:
    """What a switch recorded of the agent as the stage left it: the headline diagnostics, the
    critics' ``q/mean`` last logged in the stage and, where measured, the normalized value bias."""
    from sac_spectral.studies.events import last_in

    values = headline_diagnostics(switch.get("diagnostics") or {})
    q = [last_in(run, "q/mean", i, previous, int(switch["step"])) for i in range(seeds)]
    if all(v is not None for v in q):
        values["q/mean"] = q
    if switch.get("q_scale"):
        values["q_scale/normalized_bias"] = switch["q_scale"]["q_scale/normalized_bias"]
    return values


def switch_predictors(study: Study) -> Pairs:
    """Per measure at a switch (:func:`_at_switch`), the pairs (its value at the switch, the next
    stage's return at that stage's end, scaled) over every seed and switch of every sequence run
    whose switches keep its networks (``on_switch.reset: none``: a switch that re-draws them
    discards the networks its measures describe)."""
    out: Pairs = {}
    for run, method in dict.fromkeys((c.run, c.method) for c in study.curves):
        summary = read_summary(run)
        seq, config = summary.get("continual"), read_mapping(run / CONFIG_FILE)
        if not seq or (config.get("on_switch") or {}).get("reset", "none") != "none":
            continue
        scale = study.kind.scale(config) or 1.0
        ends = {(r["task"], int(r["seed"]), int(r[study.kind.x])): float(r[study.kind.score]) / scale
                for r in read_evals(run) if r.get(study.kind.score) is not None}
        previous = 0
        for switch in seq.get("switches", []):
            stage = int(switch["stage"]) + 1
            at, previous = _at_switch(run, switch, previous, len(summary["seeds"])), int(switch["step"])
            if stage >= len(seq["stages"]):
                continue
            end = (stage + 1) * int(seq["steps_per_task"])
            for key, values in at.items():
                for seed, value in zip(summary["seeds"], values):
                    y = ends.get((seq["stages"][stage], int(seed), end))
                    if y is not None and np.isfinite(value):
                        add_pair(out, key, float(value), y, method)
    return out


def switch_section(study: Study, data: dict[str, Any]) -> list[str]:
    """Spearman's rank correlation of each diagnostic at a switch with the next stage's return."""
    lines, data["switch_correlation"] = correlation_table(
        switch_predictors(study), "Rank correlation of each diagnostic at a task switch with the return the next stage "
        "reaches at its end (Spearman, every seed and switch of every sequence run that keeps its networks at a "
        "switch, `on_switch.reset: none`):", "seed-switches", "n")
    if not lines:
        del data["switch_correlation"]
    return lines


def task_curves(seqs: Sequences, colors: dict[str, Any], score: str) -> Any:
    """One axes per task, one above the other: each method's mean over seeds (band: ± 1.96 standard
    errors) over the whole run, evaluations in a stage's warm-up hollow, the switches dashed with each
    stage's index and task atop, and (with several tasks) the task's own stages shaded; None without
    sequences."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    tasks = list(dict.fromkeys(t for per_task in seqs.curves.values() for t in per_task))
    if not tasks:
        return None
    shade = seqs.marks is not None and len(set(seqs.stages)) > 1  # a one-task sequence's stages are all its own
    fig, axes = plt.subplots(len(tasks), 1, figsize=(max(7.0, stages_width(seqs.marks)), 0.4 + 3.2 * len(tasks)),
                             sharex=True, squeeze=False)
    for ax, task in zip(axes[:, 0], tasks):
        for s, name in enumerate(seqs.stages if shade else []):
            if name == task:
                ax.axvspan(s * seqs.steps_per_task, (s + 1) * seqs.steps_per_task, color="0.92", zorder=0)
        for method, per_task in seqs.curves.items():
            runs = list(per_task.get(task, {}).values())
            if not runs:
                continue
            steps = sorted(set.intersection(*(set(r) for r in runs)))
            y = np.array([[r[s] for s in steps] for r in runs])
            mean, half = y.mean(axis=0), 1.96 * y.std(axis=0, ddof=1) / np.sqrt(len(runs)) if len(runs) > 1 else 0.0
            ax.plot(steps, mean, color=colors[method])
            ax.fill_between(steps, mean - half, mean + half, color=colors[method], alpha=0.15)
            warm = [i for i, s in enumerate(steps) if s in seqs.warmups.get(method, {}).get(task, ())]
            ax.scatter(np.array(steps)[warm], mean[warm], s=20, facecolors="white", edgecolors=colors[method], zorder=3)
        if seqs.marks is not None:
            mark_stages(ax, seqs.marks)
        ax.set_title(task, fontsize="medium")
        ax.set_ylabel(f"{score},\nmean over seeds")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("env steps")
    seeds = {m: len({key for curves in per_task.values() for key in curves}) for m, per_task in seqs.curves.items()}
    handles = [Line2D([], [], color=colors[m], label=f"{m} ({n} seed{'s' * (n > 1)}; band ± 1.96 SE)")
               for m, n in seeds.items()]
    if any(steps for per_task in seqs.warmups.values() for steps in per_task.values()):
        handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="white", markeredgecolor="0.3",
                              label="evaluation in a warm-up (before its stage's first update)"))
    if seqs.marks is not None:
        handles.append(Line2D([], [], color="0.5", linestyle="--", linewidth=0.8,
                              label="task switch (atop each stage: its index and task)"))
    if shade:
        handles.append(Patch(color="0.92", label="the task's own stages"))
    fig.suptitle("each task over the sequence: mean over seeds")
    fig.tight_layout()
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return fig


def continual_figures(seqs: Sequences, colors: dict[str, Any], out: Path, score: str) -> list[str]:
    """Write ``continual_tasks.png`` (:func:`task_curves` of ``score``, the kind's score label) where
    there are sequence runs; returns the file names written."""
    import matplotlib.pyplot as plt

    fig = task_curves(seqs, colors, score)
    if fig is None:
        return []
    fig.savefig(out / "continual_tasks.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return ["continual_tasks.png"]
