"""``python -m sac_spectral.report RUN_OR_SWEEP_DIR ... [--out DIR] [--baseline METHOD] [--reps N]``

Aggregate results of runs and sweeps the way Agarwal et al. (2021) recommend, with their library
``rliable``: IQM, mean, median and optimality gap of normalized scores over all runs (tasks ×
seeds) with 95 % stratified-bootstrap confidence intervals, the probability that each method
improves on a baseline, performance profiles, and curves of the IQM over training. Scores: DMC
return / 1000 (other gymnasium returns as they are); continual runs: end-of-task training
accuracy. Writes ``report.md``, ``report.json`` and PNG figures to ``--out``
(default ``<first dir>/report``). Unfinished runs count with the evaluations they have so far.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sac_spectral.core.config import ConfigError, flatten, yaml_load
from sac_spectral.runs.cli import run_cli
from sac_spectral.runs.evals import read_evals
from sac_spectral.runs.layout import CONFIG_FILE, SUMMARY, SUMMARY_TASKS
from sac_spectral.sweep import STATUS, SWEEP_FILE, TASK_KEYS

# Keys that do not make two loose runs different methods: bookkeeping, and how long they ran.
NOT_METHOD = ("run_dir", "seed", "num_seeds", "threads", "progress", "device", "log_every", "checkpoint_every",
              "eval_every", "eval_episodes", "total_steps", "stream.num_tasks", "diagnostics", "diagnostics_every")
METRICS = ("Median", "IQM", "Mean", "Optimality Gap")
#: diagnostics compared before and after heavy priming (summary.json "priming"; per seed)
PRIMING_KEYS = ("grad_rank/critic/erank", "grad_rank/actor/erank", "features/critic/erank", "dormant/critic/fraction",
                "dormant/actor/fraction")
PAIR = ";"


@dataclass
class Curve:
    """The evaluations of one seed of one run: x (env steps or task index) → score."""

    method: str
    task: str
    seed: int
    run: Path
    x: np.ndarray
    y: np.ndarray
    test: np.ndarray | None = None  # continual: end-of-task test accuracy (nan where not measured)


@dataclass
class Study:
    """Curves grouped by method and task, and what was left out."""

    kind: str
    curves: list[Curve] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    grouping: str = ""
    normalized: bool = True


# --------------------------------------------------------------------------------------- reading
def _is_dmc(env: str) -> bool:
    return env.startswith(("dmc:", "dm_control/"))


def _kind(config: dict[str, Any]) -> str:
    return "train" if "env" in config else "continual"


def read_run(run_dir: Path, method: str, task_keys: Sequence[str]) -> tuple[str, list[Curve], bool]:
    """A run directory's curves (from ``evals.csv``, else ``summary.json``), its kind and whether
    its scores are normalized."""
    config = yaml_load((run_dir / CONFIG_FILE).read_text())
    kind, flat = _kind(config), flatten(config)
    task = " ".join(str(flat[k]) for k in task_keys if k in flat)
    rows = read_evals(run_dir)
    if not rows and (run_dir / SUMMARY).is_file():
        summary = json.loads((run_dir / SUMMARY).read_text())
        seeds = summary.get("seeds") or [summary.get("seed")]
        if kind == "train":
            rows = [{"step": e["step"], "seed": s, "return": r} for e in summary["eval_history"] for s, r in zip(seeds, e["returns"])]
        else:
            rows = [{**t, "seed": seeds[0]} for t in summary["tasks"]]
    normalized = kind == "continual" or _is_dmc(str(config["env"]))
    curves = []
    for seed in sorted({int(r["seed"]) for r in rows}):
        mine = [r for r in rows if r["seed"] == seed]
        if kind == "train":
            x = np.array([r["step"] for r in mine], dtype=float)
            y = np.array([r["return"] for r in mine], dtype=float) / (1000.0 if normalized else 1.0)
            curves.append(Curve(method, task, seed, run_dir, x, y))
        else:
            mine = [r for r in mine if r["train_acc"] is not None]
            if not mine:
                continue
            x = np.array([r["task"] for r in mine], dtype=float)
            y = np.array([r["train_acc"] for r in mine], dtype=float)
            test = np.array([np.nan if r.get("test_acc") is None else r["test_acc"] for r in mine], dtype=float)
            curves.append(Curve(method, task, seed, run_dir, x, y, test))
    return kind, curves, normalized


def _discover(paths: Sequence[str]) -> tuple[list[Path], list[Path]]:
    """Sweep directories and loose run directories under ``paths``."""
    sweeps, runs = [], []

    def visit(p: Path) -> None:
        if (p / SWEEP_FILE).is_file() and (p / STATUS).is_file():
            sweeps.append(p)
        elif (p / CONFIG_FILE).is_file():
            runs.append(p)
        elif p.is_dir():
            for child in sorted(p.iterdir()):
                visit(child)

    for text in paths:
        p = Path(text)
        if not p.is_dir():
            raise ConfigError(f"'{text}' is not a directory (expected a run or sweep directory)")
        visit(p)
    if not sweeps and not runs:
        raise ConfigError(f"no run or sweep directories under {', '.join(paths)} (a run holds {CONFIG_FILE}, a sweep {SWEEP_FILE})")
    return sweeps, runs


def _loose_labels(configs: list[dict[str, Any]], task_keys: Sequence[str]) -> tuple[list[str], list[str]]:
    """A label per loose run from the config keys in which they differ, and those keys."""
    flats = [{k: v for k, v in flatten(c).items() if k not in task_keys and not k.startswith(NOT_METHOD)} for c in configs]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1]
    labels = [", ".join(f"{k}={json.dumps(f.get(k), default=str)}" for k in differ) or "runs" for f in flats]
    return labels, differ


def load(paths: Sequence[str]) -> Study:
    """Every curve of the sweeps and runs under ``paths``, labelled by method and task."""
    sweeps, runs = _discover(paths)
    study: Study | None = None
    notes = []

    def add(kind: str, curves: list[Curve], normalized: bool) -> None:
        nonlocal study
        if study is None:
            study = Study(kind)
        if study.kind != kind:
            raise ConfigError("the directories mix RL and continual runs; report them separately")
        study.curves += curves
        study.normalized &= normalized

    for sweep_dir in sweeps:
        spec = yaml_load((sweep_dir / SWEEP_FILE).read_text())
        status = json.loads((sweep_dir / STATUS).read_text())
        task_keys = spec.get("task_keys") or TASK_KEYS[spec["kind"]]
        prefix = f"{spec.get('name', sweep_dir.name)}/" if len(sweeps) > 1 else ""
        for tid, entry in status["trials"].items():
            extra = [f"{k}={v}" for k, v in entry["task"].items() if k not in task_keys]
            label = prefix + entry["method"] + (f" ({', '.join(extra)})" if extra else "")
            run_dir = sweep_dir / entry["run_dir"]
            curves: list[Curve] = []
            if (run_dir / CONFIG_FILE).is_file():
                kind, curves, normalized = read_run(run_dir, label, task_keys)
                add(kind, curves, normalized)
            if not curves:
                why = entry["error"] if entry["status"] == "failed" else "no scored evaluation yet"
                notes.append(f"{sweep_dir.name}/{tid} ({entry['status']}: {why})")
        study = study or Study(spec["kind"])
        extra_keys = [k for k in spec.get("grid") or {} if k not in task_keys]
        study.grouping = "method of the sweep" + (f" and {', '.join(extra_keys)}" if extra_keys else "")
    if runs:
        configs = [yaml_load((r / CONFIG_FILE).read_text()) for r in runs]
        kinds = {_kind(c) for c in configs}
        task_keys = TASK_KEYS["train" if "train" in kinds else "continual"]
        labels, differ = _loose_labels(configs, task_keys)
        for run_dir, label in zip(runs, labels):
            kind, curves, normalized = read_run(run_dir, label, task_keys)
            add(kind, curves, normalized)
            if not curves:
                notes.append(f"{run_dir} (no scored evaluation yet)")
        grouped = f"loose runs by the config keys in which they differ ({', '.join(differ) or 'none'})"
        study = study or Study(kinds.pop())
        study.grouping = f"{study.grouping}; {grouped}" if sweeps else grouped
    assert study is not None
    study.missing = notes
    return study


def _priming_values(diagnostics: dict[str, list[float]]) -> dict[str, list[float]]:
    """Per-seed values of :data:`PRIMING_KEYS` and of each net's largest σ_max over its layers."""
    values = {k: list(diagnostics[k]) for k in PRIMING_KEYS if k in diagnostics}
    for net in ("critic", "actor"):
        sigmas = [v for k, v in diagnostics.items() if k.startswith(f"spectral/{net}/") and k.endswith("/sigma_max")]
        if sigmas:
            values[f"sigma_max/{net}"] = np.max(sigmas, axis=0).tolist()
    return values


def priming_diagnostics(study: Study) -> dict[str, dict[str, list[list[float]]]]:
    """Per method, the heavy-priming diagnostics of its finished runs: ``{key: [before, after]}``
    with one value per seed (:func:`_priming_values`)."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    for method, run in dict.fromkeys((c.method, c.run) for c in study.curves):
        path = run / SUMMARY
        priming = json.loads(path.read_text()).get("priming") if path.is_file() else None
        if not priming or not {"before", "after"} <= set(priming):
            continue
        before, after = _priming_values(priming["before"]), _priming_values(priming["after"])
        for key in (k for k in before if k in after):
            entry = out.setdefault(method, {}).setdefault(key, [[], []])
            entry[0] += before[key]
            entry[1] += after[key]
    return out


# --------------------------------------------------------------------------------------- aligning
@dataclass
class Aligned:
    """Rectangular score arrays: ``scores[m]`` is [runs, tasks, steps] on the common steps ``x``."""

    methods: list[str]
    tasks: list[str]
    x: np.ndarray
    scores: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    seeds: dict[str, list[int]]
    notes: list[str]


def align(study: Study) -> Aligned:
    """Keep the tasks every method has, the same number of seeds per task within a method (the
    fewest any task has) and the evaluation steps every kept curve has; say what was cut."""
    curves = study.curves
    if not curves:
        raise ConfigError("no evaluations to report yet")
    methods = list(dict.fromkeys(c.method for c in curves))
    all_tasks = list(dict.fromkeys(c.task for c in curves))
    tasks = [t for t in all_tasks if all(any(c.method == m and c.task == t for c in curves) for m in methods)]
    notes = [f"task {t} left out: not every method has runs on it" for t in all_tasks if t not in tasks]
    seeds: dict[str, list[int]] = {}
    keep: dict[tuple[str, str], list[int]] = {}
    for m in methods:
        per_task = {t: sorted({c.seed for c in curves if c.method == m and c.task == t}) for t in tasks}
        n = min(len(s) for s in per_task.values())
        for t, s in per_task.items():
            if len(s) > n:
                notes.append(f"{m} on {t}: seeds {s[n:]} left out (another task has only {n})")
            keep[m, t] = s[:n]
        seeds[m] = per_task[tasks[0]][:n]
    kept = [c for c in curves if c.task in tasks and c.seed in keep[c.method, c.task]]
    common = sorted(set.intersection(*(set(c.x.tolist()) for c in kept)))
    if not common:
        raise ConfigError("the runs share no evaluation step; give them a common eval_every")
    x = np.array(common)
    cut = [c for c in kept if c.x.max() > x[-1]]
    if cut:
        notes.append(f"curves cut to {x[-1]:g}, the last evaluation every run has reached: {len(cut)} of {len(kept)} "
                     f"seed-runs went further (up to {max(c.x.max() for c in cut):g})")
    scores = {m: np.full((len(seeds[m]), len(tasks), len(x)), np.nan) for m in methods}
    test = {m: np.full_like(a, np.nan) for m, a in scores.items()}
    for c in kept:
        i, j, idx = keep[c.method, c.task].index(c.seed), tasks.index(c.task), np.searchsorted(c.x, x)
        scores[c.method][i, j] = c.y[idx]
        if c.test is not None:
            test[c.method][i, j] = c.test[idx]
    return Aligned(methods, tasks, x, scores, test, seeds, notes)


def final_scores(al: Aligned, kind: str) -> dict[str, np.ndarray]:
    """[runs, tasks] per method: the score at the last common step (RL) or the mean over the last
    ``SUMMARY_TASKS`` common tasks (continual, as the runner's summary)."""
    window = SUMMARY_TASKS if kind == "continual" else 1
    return {m: s[..., -window:].mean(axis=-1) for m, s in al.scores.items()}


# --------------------------------------------------------------------------------------- statistics
def aggregates(scores: np.ndarray) -> np.ndarray:
    """Median, IQM, mean and optimality gap of a [runs, tasks] array (rliable's definitions)."""
    from rliable import metrics

    return np.array([metrics.aggregate_median(scores), metrics.aggregate_iqm(scores),
                     metrics.aggregate_mean(scores), metrics.aggregate_optimality_gap(scores)])


def iqm_per_step(scores: np.ndarray) -> np.ndarray:
    """IQM over runs × tasks at each step of a [runs, tasks, steps] array: rliable's
    ``metrics.aggregate_iqm`` of every step's slice, computed for all steps at once."""
    from scipy.stats import trim_mean

    return trim_mean(scores.reshape(-1, scores.shape[-1]), proportiontocut=0.25, axis=0)


def profile(scores: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """Fraction of runs scoring above each τ: rliable's ``library.score_distributions`` (a
    ``np.vectorize`` over τ), computed for all τ at once."""
    return (scores.reshape(-1, 1) > taus.reshape(1, -1)).mean(axis=0)


def interval_estimates(scores: dict[str, Any], func: Callable[..., np.ndarray], reps: int, seed: int) -> tuple[dict, dict]:
    """rliable's stratified-bootstrap point and 95 % interval estimates for each key. rliable draws
    its resampling indices from numpy's global generator: it is seeded with ``seed`` for each key
    (so a method's interval does not depend on the other methods in the report) and restored
    afterwards."""
    from rliable import library as rly

    state = np.random.get_state()
    points, intervals = {}, {}
    try:
        with warnings.catch_warnings():  # arch deprecates the RandomState that rliable hands it
            warnings.filterwarnings("ignore", "random_state is deprecated", FutureWarning)
            for key, value in scores.items():
                np.random.seed(seed)
                point, interval = rly.get_interval_estimates(
                    {key: value}, func, reps=reps, random_state=np.random.RandomState(seed))
                points[key], intervals[key] = point[key], interval[key]
    finally:
        np.random.set_state(state)
    return points, intervals


def compute_statistics(al: Aligned, kind: str, baseline: str, reps: int, seed: int) -> dict[str, Any]:
    from rliable import metrics

    final = final_scores(al, kind)
    point, ci = interval_estimates(final, aggregates, reps, seed)
    curve_point, curve_ci = interval_estimates(al.scores, iqm_per_step, reps, seed)
    pairs = {f"{m}{PAIR}{baseline}": (final[m], final[baseline]) for m in al.methods if m != baseline}
    poi_point, poi_ci = interval_estimates(pairs, metrics.probability_of_improvement, reps, seed) if pairs else ({}, {})
    lo = min(0.0, float(min(f.min() for f in final.values())))
    taus = np.linspace(lo, max(1.0, float(max(f.max() for f in final.values()))), 81)
    prof_point, prof_ci = interval_estimates(final, lambda s: profile(s, taus), reps, seed)
    # Per task: the mean over seeds at each step; the bootstrap resamples seeds within each task.
    shape = (len(al.tasks), len(al.x))
    task_point, task_ci = interval_estimates(al.scores, lambda s: s.mean(axis=0).ravel(), reps, seed)
    task_mean = {m: (task_point[m].reshape(shape), task_ci[m].reshape(2, *shape)) for m in al.methods}
    return {"final": final, "point": point, "ci": ci, "curve_point": curve_point, "curve_ci": curve_ci,
            "poi_point": poi_point, "poi_ci": poi_ci, "taus": taus, "prof_point": prof_point, "prof_ci": prof_ci,
            "task_mean": task_mean}


# --------------------------------------------------------------------------------------- figures
def _colors(methods: Sequence[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


def figures(al: Aligned, st: dict[str, Any], kind: str, out: Path, normalized: bool) -> list[str]:
    """Write the PNGs; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import plot_utils

    colors = _colors(al.methods)
    xlabel = "env steps" if kind == "train" else "task"
    score = ("normalized return" if normalized else "return") if kind == "train" else "train accuracy"
    written = []

    def save(fig: Any, name: str) -> None:
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(name)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_utils.plot_sample_efficiency_curve(
        al.x, st["curve_point"], st["curve_ci"], algorithms=al.methods, colors=colors, ax=ax, xlabel=xlabel,
        ylabel=f"IQM {score}", labelsize="large", ticklabelsize="medium", marker="." if len(al.x) > 1 else "o")
    ax.legend(fontsize="medium")
    ax.set_title(f"IQM over {len(al.tasks)} task(s) × seeds, 95 % stratified-bootstrap CI")
    save(fig, "iqm_curves.png")

    cols = min(3, len(al.tasks))
    rows = -(-len(al.tasks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    for j, task in enumerate(al.tasks):
        ax = axes[j // cols][j % cols]
        for m in al.methods:
            point, ci = st["task_mean"][m]
            ax.plot(al.x, point[j], color=colors[m], label=m, marker="." if len(al.x) > 1 else "o")
            ax.fill_between(al.x, ci[0, j], ci[1, j], color=colors[m], alpha=0.2)
        ax.set_title(task, fontsize="medium")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"mean {score}")
        ax.grid(alpha=0.3)
    for j in range(len(al.tasks), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle("per task: mean over seeds, 95 % bootstrap CI")
    fig.tight_layout()
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    save(fig, "per_task_curves.png")

    metrics = list(METRICS) if normalized else list(METRICS[:3])
    point = {m: st["point"][m][: len(metrics)] for m in al.methods}
    ci = {m: st["ci"][m][:, : len(metrics)] for m in al.methods}
    fig, _ = plot_utils.plot_interval_estimates(
        point, ci, metric_names=metrics, algorithms=al.methods, colors=colors, xlabel=f"final {score}",
        subfigure_width=3.6, row_height=0.55, xlabel_y_coordinate=-0.25 if len(al.methods) < 4 else -0.1)
    save(fig, "final_scores.png")

    if st["poi_point"]:
        fig, ax = plt.subplots(figsize=(5, 0.6 * len(st["poi_point"]) + 1.2))
        plot_utils.plot_probability_of_improvement(
            st["poi_point"], st["poi_ci"], pair_separator=PAIR, ax=ax, xticks=[0.0, 0.25, 0.5, 0.75, 1.0],
            left_ylabel="method X", right_ylabel="baseline Y", ticklabelsize="medium", labelsize="medium")
        ax.axvline(0.5, color="k", linestyle=":", alpha=0.5)
        save(fig, "probability_of_improvement.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_utils.plot_performance_profiles(
        st["prof_point"], st["taus"], performance_profile_cis=st["prof_ci"], colors=colors, ax=ax,
        xlabel=f"final {score} τ", ylabel="fraction of runs with score > τ", labelsize="large", ticklabelsize="medium")
    ax.legend(fontsize="medium")
    save(fig, "performance_profile.png")

    if kind == "continual":
        splits = [("train", al.scores)] + ([("test", al.test)] if any(np.isfinite(a).any() for a in al.test.values()) else [])
        fig, axes = plt.subplots(len(al.tasks), len(splits), figsize=(6 * len(splits), 3.6 * len(al.tasks)), squeeze=False)
        for j, task in enumerate(al.tasks):
            for k, (split, arrays) in enumerate(splits):
                ax = axes[j][k]
                for m in al.methods:
                    a = arrays[m][:, j]
                    mean = np.nanmean(a, axis=0)
                    sd = np.nanstd(a, axis=0)
                    ax.plot(al.x, mean, color=colors[m], label=m, marker=".")
                    ax.fill_between(al.x, mean - sd, mean + sd, color=colors[m], alpha=0.2)
                ax.set_title(f"{task}: end-of-task {split} accuracy (mean ± std over seeds)", fontsize="medium")
                ax.set_xlabel("task")
                ax.set_ylabel(f"{split} accuracy")
                ax.set_ylim(-0.02, 1.02)
                ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize="small")
        fig.tight_layout()
        save(fig, "accuracy_per_task.png")
    return written


# --------------------------------------------------------------------------------------- report.md
def _ci(point: float, lo: float, hi: float, one_seed: bool) -> str:
    return f"{point:.3f}" if one_seed else f"{point:.3f} [{lo:.3f}, {hi:.3f}]"


def write_report(study: Study, al: Aligned, st: dict[str, Any], out: Path, baseline: str, pngs: list[str],
                 reps: int, sources: Sequence[str]) -> dict[str, Any]:
    kind, normalized = study.kind, study.normalized
    one_seed = all(len(s) == 1 for s in al.seeds.values())
    score = ("return / 1000 (DMC)" if normalized else "return (not normalized: a non-DMC task)") if kind == "train" \
        else "end-of-task training accuracy"
    final_at = (f"step {al.x[-1]:g}" if kind == "train"
                else f"the mean over the last {min(SUMMARY_TASKS, len(al.x))} tasks up to task {al.x[-1]:g}")
    lines = [
        "# Report", "",
        f"Sources: {', '.join(sources)}  ",
        f"Kind: {'RL (sac_spectral.train)' if kind == 'train' else 'continual (sac_spectral.continual)'}; "
        f"score: {score}; final score: {final_at}.  ",
        f"Grouped by: {study.grouping}.  ",
        f"Tasks ({len(al.tasks)}): {', '.join(al.tasks)}.  ",
        f"Statistics: rliable, {reps} bootstrap resamples, 95 % stratified-bootstrap confidence intervals over "
        "runs within each task.",
    ]
    if one_seed:
        lines.append("\n**One seed per task: no confidence intervals** (the bootstrap has nothing to resample).")
    lines += ["", "## Aggregate final scores", ""]
    metrics = list(METRICS) if normalized else list(METRICS[:3])
    lines.append("| method | " + " | ".join(metrics) + " | tasks | seeds per task |")
    lines.append("|---" * (len(metrics) + 3) + "|")
    data: dict[str, Any] = {"kind": kind, "score": score, "tasks": al.tasks, "final_x": float(al.x[-1]),
                            "reps": reps, "baseline": baseline, "methods": {}}
    for m in al.methods:
        p, c = st["point"][m], st["ci"][m]
        cells = [_ci(p[i], c[0, i], c[1, i], one_seed) for i in range(len(metrics))]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {len(al.tasks)} | {len(al.seeds[m])} |")
        data["methods"][m] = {
            "seeds": al.seeds[m], "n_tasks": len(al.tasks), "n_runs": int(st["final"][m].size),
            **{name.lower().replace(" ", "_"): [float(p[i]), float(c[0, i]), float(c[1, i])] for i, name in enumerate(metrics)},
            "iqm_curve": {"x": al.x.tolist(), "point": st["curve_point"][m].tolist(),
                          "lo": st["curve_ci"][m][0].tolist(), "hi": st["curve_ci"][m][1].tolist()},
        }
    if st["poi_point"]:
        lines += ["", f"## Probability of improvement over `{baseline}`", "",
                  f"P(X > {baseline}): the probability that a run of X on a task scores higher than a run of "
                  f"{baseline} on the same task, averaged over tasks.", "",
                  "| method X | P(X > baseline) |", "|---|---|"]
        data["probability_of_improvement"] = {}
        for pair, p in st["poi_point"].items():
            m = pair.split(PAIR)[0]
            lo, hi = np.ravel(st["poi_ci"][pair])
            lines.append(f"| {m} | {_ci(float(p), lo, hi, one_seed)} |")
            data["probability_of_improvement"][m] = [float(p), float(lo), float(hi)]
    lines += ["", "## Final score per task (mean ± std over seeds)", "",
              "| method | " + " | ".join(al.tasks) + " |", "|---" * (len(al.tasks) + 1) + "|"]
    for m in al.methods:
        f = st["final"][m]
        lines.append(f"| {m} | " + " | ".join(f"{f[:, j].mean():.3f} ± {f[:, j].std(ddof=1) if len(f) > 1 else 0:.3f}"
                                               for j in range(len(al.tasks))) + " |")
    if kind == "continual":
        n = SUMMARY_TASKS
        lines += ["", f"## First {n} and last {n} tasks (mean ± std over seeds and tasks)", "",
                  f"| method | train acc, first {n} | train acc, last {n} | test acc, first {n} | test acc, last {n} |",
                  "|---|---|---|---|---|"]
        data["first_last"] = {}
        for m in al.methods:
            row = {}
            for split, arrays in (("train", al.scores), ("test", al.test)):
                for part, sl in (("first", slice(0, n)), ("last", slice(-n, None))):
                    per_run = np.nanmean(arrays[m][..., sl], axis=-1).ravel() if np.isfinite(arrays[m]).any() else None
                    row[f"{split}_{part}"] = None if per_run is None else [float(per_run.mean()), float(per_run.std(ddof=1) if len(per_run) > 1 else 0.0)]
            cells = ["—" if v is None else f"{v[0]:.3f} ± {v[1]:.3f}" for v in row.values()]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
            data["first_last"][m] = row
    primed = priming_diagnostics(study)
    if primed:
        keys = list(dict.fromkeys(k for d in primed.values() for k in d))
        lines += ["", "## Heavy priming: diagnostics before → after the priming updates (mean over seeds)", "",
                  "| method | " + " | ".join(f"`{k}`" for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for m, d in primed.items():
            cells = [f"{np.mean(d[k][0]):.3g} → {np.mean(d[k][1]):.3g}" if k in d else "—" for k in keys]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        data["priming"] = primed
    lines += ["", "## What was cut or missing", ""]
    lines += [f"- {note}" for note in al.notes + study.missing] or ["- nothing"]
    lines += ["", "## Figures", ""]
    captions = {
        "iqm_curves.png": "IQM of the score over training (all tasks × seeds) with 95 % CI bands",
        "per_task_curves.png": "each task: mean over seeds with 95 % bootstrap CI",
        "final_scores.png": "final median, IQM, mean (and optimality gap) with 95 % CIs; the bar is the CI, the tick the point estimate",
        "probability_of_improvement.png": f"P(X > {baseline}) with 95 % CIs; right of 0.5 = X tends to beat the baseline",
        "performance_profile.png": "fraction of runs whose final score exceeds τ; a curve above another dominates it",
        "accuracy_per_task.png": "end-of-task train (and test) accuracy by task index, mean ± std over seeds",
    }
    lines += [f"- `{name}`: {captions[name]}\n\n  ![{name}]({name})" for name in pngs]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    data["notes"] = al.notes + study.missing
    (out / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sac_spectral.report", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="RUN_OR_SWEEP_DIR", help="run directories, sweep directories or folders holding them")
    parser.add_argument("--out", help="output folder (default: <first dir>/report)")
    parser.add_argument("--baseline", help="method the others are compared with (default: the first)")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples (default: 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default: 0)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("rliable") is None or importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("the report needs rliable and matplotlib; pip install -e '.[report]'")
    if args.reps < 1:
        raise ConfigError(f"--reps must be >= 1, got {args.reps}")
    study = load(args.dirs)
    al = align(study)
    baseline = args.baseline or al.methods[0]
    if baseline not in al.methods:
        raise ConfigError(f"--baseline '{baseline}' is not one of the methods: {', '.join(al.methods)}")
    out = Path(args.out) if args.out else Path(args.dirs[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    st = compute_statistics(al, study.kind, baseline, args.reps, args.seed)
    pngs = figures(al, st, study.kind, out, study.normalized)
    data = write_report(study, al, st, out, baseline, pngs, args.reps, args.dirs)
    for m, d in data["methods"].items():
        print(f"{m:>24}: IQM {d['iqm'][0]:.3f} [{d['iqm'][1]:.3f}, {d['iqm'][2]:.3f}]  ({d['n_tasks']} task(s) × {len(d['seeds'])} seed(s))")
    print(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
