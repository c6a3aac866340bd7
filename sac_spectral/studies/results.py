"""The runs of a report: read run and sweep directories into per-seed curves labelled by method and
task, and align them into rectangular score arrays (common tasks, seeds and evaluation steps)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sac_spectral.core.config import ConfigError, flatten, one_line, yaml_load
from sac_spectral.runs.evals import EVALS, read_evals
from sac_spectral.runs.kinds import RunKind, dir_kind, get_kind
from sac_spectral.runs.layout import CONFIG_FILE, SUMMARY
from sac_spectral.studies.spec import STATUS, SWEEP_FILE

# Keys that do not make two loose runs different methods: bookkeeping, and how long they ran.
NOT_METHOD = ("run_dir", "seed", "num_seeds", "threads", "progress", "device", "log_every", "checkpoint_every",
              "eval_every", "eval_episodes", "total_steps", "stream.num_tasks", "diagnostics", "diagnostics_every")
#: diagnostics compared before and after heavy priming (summary.json "priming"; per seed)
PRIMING_KEYS = ("grad_rank/critic/erank", "grad_rank/actor/erank", "features/critic/erank",
                "features/critic/stable_rank",
                "features/critic/norm", "active/critic/fraction", "dormant/critic/fraction", "dormant/actor/fraction",
                "weights/critic/distance_from_init", "churn/critic")


@dataclass
class Curve:
    """The evaluations of one seed of one run: x (its kind's ``x``: env steps, task index) → score."""

    method: str
    task: str
    seed: int
    run: Path
    x: np.ndarray
    y: np.ndarray
    test: np.ndarray | None = None  # the kind's ``test`` score (continual: test accuracy; nan where not measured)


@dataclass
class Study:
    """Curves grouped by method and task, and what was left out."""

    kind: RunKind
    curves: list[Curve] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    grouping: str = ""
    normalized: bool = True


def read_mapping(path: Path) -> dict[str, Any]:
    """A JSON (``.json``) or YAML file that must hold a mapping; anything else is bad input."""
    try:
        data = json.loads(path.read_text()) if path.suffix == ".json" else yaml_load(path.read_text())
    except (ValueError, yaml.YAMLError) as err:
        raise ConfigError(f"'{path}' cannot be read: {one_line(err)}; restore or remove it") from None
    if not isinstance(data, dict):
        raise ConfigError(f"'{path}' holds {type(data).__name__}, not a mapping of keys; restore or remove it")
    return data


def read_summary(run_dir: Path) -> dict[str, Any]:
    """A run's ``summary.json`` (empty where the run has not finished)."""
    return read_mapping(run_dir / SUMMARY) if (run_dir / SUMMARY).is_file() else {}


def _summary_rows(run_dir: Path, kind: RunKind) -> list[dict[str, Any]]:
    """The evaluations a run's ``summary.json`` records (for runs written before ``evals.csv``)."""
    path = run_dir / SUMMARY
    try:
        return kind.history(read_mapping(path))
    except (KeyError, TypeError) as err:
        raise ConfigError(f"'{path}' lacks the evaluations of a {kind.name} run ({type(err).__name__}: {err}); "
                          "restore or remove it") from None


def _rows(run_dir: Path, kind: RunKind) -> list[dict[str, Any]]:
    """The run's evaluation rows: ``evals.csv``, else ``summary.json``."""
    try:
        rows = read_evals(run_dir)
    except (ValueError, KeyError) as err:
        raise ConfigError(f"'{run_dir / EVALS}' has a cell that is not a number ({one_line(err)}); "
                          "fix or remove that row") from None
    if not rows and (run_dir / SUMMARY).is_file():
        rows = _summary_rows(run_dir, kind)
    return rows


def _ordered(run_dir: Path, seed: int, x: np.ndarray, key: str) -> np.ndarray:
    """The order that sorts a seed's evaluations by ``key``; a key evaluated twice is bad input."""
    values, counts = np.unique(x, return_counts=True)
    if (counts > 1).any():
        raise ConfigError(f"'{run_dir / EVALS}': {key} {values[counts > 1][0]:g} appears {counts.max()} times for seed "
                          f"{seed}; a run evaluates each {key} once (remove the extra rows)")
    return np.argsort(x, kind="stable")


def read_run(run_dir: Path, method: str, task_keys: Sequence[str]) -> tuple[RunKind, list[Curve], bool]:
    """A run directory's curves (from ``evals.csv``, else ``summary.json``) sorted by its kind's
    ``x``, its kind and whether its scores are normalized. Evaluations without a score (a continual
    regression task has no accuracy) are left out."""
    config = read_mapping(run_dir / CONFIG_FILE)
    kind, flat = get_kind(dir_kind(run_dir, config)), flatten(config)
    task = " ".join(str(flat[k]) for k in task_keys if k in flat)
    rows = [r for r in kind.curve_rows(_rows(run_dir, kind), config) if r.get(kind.score) is not None]
    scale = kind.scale(config)
    curves = []
    for seed in sorted({int(r["seed"]) for r in rows}):
        mine = [r for r in rows if r["seed"] == seed]
        x = np.array([r[kind.x] for r in mine], dtype=float)
        y = np.array([r[kind.score] for r in mine], dtype=float) / (scale or 1.0)
        test = np.array([np.nan if r.get(kind.test) is None else r[kind.test] for r in mine],
                        dtype=float) if kind.test else None
        i = _ordered(run_dir, seed, x, kind.x)
        curves.append(Curve(method, task, seed, run_dir, x[i], y[i], None if test is None else test[i]))
    return kind, curves, scale is not None


def finite_curves(curves: list[Curve], warnings: list[str]) -> list[Curve]:
    """The curves whose scores are all finite; each other one is named in ``warnings``."""
    kept = []
    for c in curves:
        bad = ~np.isfinite(c.y)
        if bad.any():
            warnings.append(f"{c.run} (seed {c.seed}) left out: non-finite score "
                            f"({', '.join(f'{v:g}' for v in c.y[bad][:3])}) at x = "
                            f"{', '.join(f'{v:g}' for v in c.x[bad][:3])}")
        else:
            kept.append(c)
    return kept


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
        raise ConfigError(f"no run or sweep directories under {', '.join(paths)} (a run holds {CONFIG_FILE}, a sweep "
                          f"{SWEEP_FILE})")
    return sweeps, runs


def _loose_labels(runs: list[Path], configs: list[dict[str, Any]],
                  task_keys: Sequence[str]) -> tuple[list[str], list[str]]:
    """A label per loose run from the config keys in which they differ, and those keys; runs that
    differ in none are one method: a lone run's directory name, else ``runs``."""
    flats = [{k: v for k,
              v in flatten(c).items() if k not in task_keys and not k.startswith(NOT_METHOD)} for c in configs]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1]
    same = runs[0].name if len(runs) == 1 else "runs"
    labels = [", ".join(f"{k}={json.dumps(f.get(k), default=str)}" for k in differ) or same for f in flats]
    return labels, differ


def load(paths: Sequence[str]) -> Study:
    """Every curve of the sweeps and runs under ``paths``, labelled by method and task."""
    sweeps, runs = _discover(paths)
    study: Study | None = None
    notes: list[str] = []
    warned: list[str] = []

    def add(kind: RunKind, curves: list[Curve], normalized: bool) -> None:
        nonlocal study
        if study is None:
            study = Study(kind)
        if study.kind != kind:
            raise ConfigError(f"the directories mix {study.kind.name} and {kind.name} runs; report them separately")
        study.curves += finite_curves(curves, warned)
        study.normalized &= normalized

    for sweep_dir in sweeps:
        spec = read_mapping(sweep_dir / SWEEP_FILE)
        status = read_mapping(sweep_dir / STATUS)
        task_keys = spec.get("task_keys") or get_kind(spec["kind"]).task_keys
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
        study = study or Study(get_kind(spec["kind"]))
        extra_keys = [k for k in spec.get("grid") or {} if k not in task_keys]
        study.grouping = "method of the sweep" + (f" and {', '.join(extra_keys)}" if extra_keys else "")
    if runs:
        configs = [read_mapping(r / CONFIG_FILE) for r in runs]
        kinds = {dir_kind(r, c) for r, c in zip(runs, configs)}
        if len(kinds) > 1:
            raise ConfigError(f"the directories mix {' and '.join(sorted(kinds))} runs; report them separately")
        task_keys = get_kind(next(iter(kinds))).task_keys
        labels, differ = _loose_labels(runs, configs, task_keys)
        for run_dir, label in zip(runs, labels):
            kind, curves, normalized = read_run(run_dir, label, task_keys)
            add(kind, curves, normalized)
            if not curves:
                notes.append(f"{run_dir} (no scored evaluation yet)")
        grouped = f"loose runs by the config keys in which they differ ({', '.join(differ) or 'none'})"
        study = study or Study(get_kind(kinds.pop()))
        study.grouping = f"{study.grouping}; {grouped}" if sweeps else grouped
    assert study is not None
    study.missing, study.warnings = notes, warned
    return study


def headline_diagnostics(diagnostics: dict[str, list[float]]) -> dict[str, list[float]]:
    """Per-seed values of :data:`PRIMING_KEYS` and of each net's largest σ_max over its layers."""
    values = {k: list(diagnostics[k]) for k in PRIMING_KEYS if k in diagnostics}
    for net in ("critic", "actor"):
        sigmas = [v for k, v in diagnostics.items() if k.startswith(f"spectral/{net}/") and k.endswith("/sigma_max")]
        if sigmas:
            values[f"sigma_max/{net}"] = np.max(sigmas, axis=0).tolist()
    return values


#: per diagnostic: its values, the scores paired with them, and each pair's method
Pairs = dict[str, tuple[list[float], list[float], list[str]]]


def add_pair(out: Pairs, key: str, value: float, score: float, method: str) -> None:
    """Append one (value, score, method) to ``out[key]``."""
    xs, ys, groups = out.setdefault(key, ([], [], []))
    xs.append(value)
    ys.append(score)
    groups.append(method)


def priming_predictors(study: Study) -> Pairs:
    """Per diagnostic (:func:`headline_diagnostics`), the pairs (its value after heavy priming, the
    seed's final score), with the run's method, over every seed of every run that has priming
    diagnostics."""
    out: Pairs = {}
    summaries: dict[Path, dict[str, Any]] = {}
    for c in study.curves:
        if c.run not in summaries:
            path = c.run / SUMMARY
            summaries[c.run] = read_mapping(path) if path.is_file() else {}
        summary = summaries[c.run]
        after, seeds = (summary.get("priming") or {}).get("after"), summary.get("seeds") or []
        if not after or c.seed not in seeds or not len(c.y) or not np.isfinite(c.y[-1]):
            continue
        for key, values in headline_diagnostics(after).items():
            if len(values) == len(seeds) and np.isfinite(values[seeds.index(c.seed)]):
                add_pair(out, key, float(values[seeds.index(c.seed)]), float(c.y[-1]), c.method)
    return out


def within_methods(values: list[float], groups: list[str]) -> np.ndarray:
    """``values`` less their method's mean (the methods with one value only dropped: NaN)."""
    x, g = np.asarray(values, dtype=float), np.asarray(groups)
    out = np.full_like(x, np.nan)
    for m in set(groups):
        if (g == m).sum() > 1:
            out[g == m] = x[g == m] - x[g == m].mean()
    return out


def _spearman(xs: np.ndarray, ys: np.ndarray) -> tuple[float, float]:
    from scipy.stats import spearmanr

    keep = np.isfinite(xs) & np.isfinite(ys)
    xs, ys = xs[keep], ys[keep]
    if len(xs) < 3 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
        return float("nan"), float("nan")
    rho, p = spearmanr(xs, ys)
    return float(rho), float(p)


def correlation_table(pairs: Pairs, caption: str, count: str,
                      key: str) -> tuple[list[str], dict[str, dict[str, float]]]:
    """Spearman's rank correlation of each diagnostic's values with the scores paired with them
    (``pairs``; three pairs at least), pooled and within the methods (each method's mean taken out of
    the values and of the scores, so that a difference between methods in both does not count): the
    markdown lines under ``caption``, the pairs counted in a column ``count``, and per diagnostic
    ``{rho, p, rho_within, p_within, key: n}``."""
    lines = ["", caption, "", f"| diagnostic | ρ | p | ρ within a method | p | {count} |", "|---|---|---|---|---|---|"]
    out = {}
    for name, (xs, ys, groups) in pairs.items():
        if len(xs) < 3:
            continue
        rho, p = _spearman(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float))
        within, p_within = _spearman(within_methods(xs, groups), within_methods(ys, groups))
        lines.append(f"| `{name}` | {rho:.2f} | {p:.2g} | {within:.2f} | {p_within:.2g} | {len(xs)} |")
        out[name] = {"rho": rho, "p": p, "rho_within": within, "p_within": p_within, key: len(xs)}
    lines += ["", "ρ within a method: each method's mean taken out of the diagnostic and of the score, so that what "
              "differs between the methods in both does not count."]
    return (lines, out) if out else ([], out)


def priming_diagnostics(study: Study) -> dict[str, dict[str, list[list[float]]]]:
    """Per method, the heavy-priming diagnostics of its finished runs: ``{key: [before, after]}``
    with one value per seed (:func:`headline_diagnostics`)."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    for method, run in dict.fromkeys((c.method, c.run) for c in study.curves):
        path = run / SUMMARY
        priming = read_mapping(path).get("priming") if path.is_file() else None
        if not priming or not {"before", "after"} <= set(priming):
            continue
        before, after = headline_diagnostics(priming["before"]), headline_diagnostics(priming["after"])
        for key in (k for k in before if k in after):
            entry = out.setdefault(method, {}).setdefault(key, [[], []])
            entry[0] += before[key]
            entry[1] += after[key]
    return out



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


def final_scores(al: Aligned, kind: RunKind) -> dict[str, np.ndarray]:
    """[runs, tasks] per method: the mean score over the kind's last ``window`` common evaluations
    (RL: the last step; continual: the last 5 tasks, as the runner's summary)."""
    return {m: s[..., -kind.window:].mean(axis=-1) for m, s in al.scores.items()}
