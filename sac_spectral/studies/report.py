"""``python -m sac_spectral.report RUN_OR_SWEEP_DIR ... [--out DIR] [--baseline METHOD] [--fresh-reference METHOD]
[--reps N]``

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
from difflib import get_close_matches
from pathlib import Path
from typing import Any

import numpy as np

from sac_spectral.core.config import ConfigError
from sac_spectral.runs.kinds import RunKind
from sac_spectral.runs.layout import CONFIG_FILE
from sac_spectral.studies import mechanism
from sac_spectral.studies.figures import METRICS, PAIR, figures, method_colors, padded
from sac_spectral.studies.results import (
    Aligned,
    Study,
    align,
    correlation_table,
    final_scores,
    load,
    priming_diagnostics,
    priming_predictors,
    read_mapping,
)
from sac_spectral.studies.sequences import (
    Sequences,
    continual_figures,
    continual_section,
    read_sequences,
    switch_section,
)


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


#: fewer seeds per task than this (per method) gets a warning in the report and on its figures
MIN_SEEDS = 5


def interval_estimates(scores: dict[str, Any], func: Callable[..., np.ndarray], reps: int,
                       seed: int) -> tuple[dict, dict]:
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


def compute_statistics(al: Aligned, kind: RunKind, baseline: str, reps: int, seed: int) -> dict[str, Any]:
    from rliable import metrics

    final = final_scores(al, kind)
    point, ci = interval_estimates(final, aggregates, reps, seed)
    curve_point, curve_ci = interval_estimates(al.scores, iqm_per_step, reps, seed)
    pairs = {f"{m}{PAIR}{baseline}": (final[m], final[baseline]) for m in al.methods if m != baseline}
    poi_point, poi_ci = interval_estimates(pairs, metrics.probability_of_improvement, reps, seed) if pairs else ({}, {})
    taus = np.linspace(*padded(float(min(f.min() for f in final.values())), float(max(f.max() for f in final.values())),
                                0.05), 81)
    prof_point, prof_ci = interval_estimates(final, lambda s: profile(s, taus), reps, seed)
    # Per task: the mean over seeds at each step; the bootstrap resamples seeds within each task.
    shape = (len(al.tasks), len(al.x))
    task_point, task_ci = interval_estimates(al.scores, lambda s: s.mean(axis=0).ravel(), reps, seed)
    task_mean = {m: (task_point[m].reshape(shape), task_ci[m].reshape(2, *shape)) for m in al.methods}
    return {"final": final, "point": point, "ci": ci, "curve_point": curve_point, "curve_ci": curve_ci,
            "poi_point": poi_point, "poi_ci": poi_ci, "taus": taus, "prof_point": prof_point, "prof_ci": prof_ci,
            "task_mean": task_mean}


def _digits(*values: float) -> list[str]:
    """The values with 3 significant digits, or more (up to 6) where that tells unequal values apart."""
    for digits in range(3, 7):
        texts = [f"{v:.{digits}g}" for v in values]
        if len(set(texts)) == len(set(values)):
            break
    return texts


def _ci(point: float, lo: float, hi: float, one_seed: bool) -> str:
    """``point [lo, hi]``; with one seed the bootstrap has nothing to resample: ``point (1 seed, no CI)``."""
    if one_seed:
        return f"{_digits(point)[0]} (1 seed, no CI)"
    p, a, b = _digits(point, lo, hi)
    return f"{p} [{a}, {b}]"


def _score_name(study: Study) -> str:
    return study.kind.score_label if study.normalized else study.kind.raw_label


def _header(study: Study, al: Aligned, reps: int, sources: Sequence[str], cautions: list[str]) -> list[str]:
    kind, score = study.kind, _score_name(study)
    final_at = (f"{kind.x} {al.x[-1]:g}" if kind.window == 1 else
                f"the mean over the last {min(kind.window, len(al.x))} evaluations up to {kind.x} {al.x[-1]:g}")
    lines = [
        "# Report", "",
        f"Sources: {', '.join(sources)}  ",
        f"Kind: {kind.title}; "
        f"score: {score}; final score: {final_at}.  ",
        f"Grouped by: {study.grouping}.  ",
        f"Tasks ({len(al.tasks)}): {', '.join(al.tasks)}.  ",
        f"Statistics: rliable, {reps} bootstrap resamples, 95 % stratified-bootstrap confidence intervals over "
        "runs within each task.",
    ]
    single = [m for m, s in al.seeds.items() if len(s) == 1]
    if single:
        who = "" if len(single) == len(al.seeds) else f" for {', '.join(single)}"
        lines.append(f"\n**One seed per task{who}: no confidence intervals** (the bootstrap has nothing to resample).")
    if cautions:
        lines += ["", "## Warnings", "", *(f"- **{w}**" for w in cautions)]
    return lines


def _aggregate_section(al: Aligned, st: dict[str, Any], metrics: list[str], data: dict[str, Any]) -> list[str]:
    lines = ["", "## Aggregate final scores", "", "| method | " + " | ".join(metrics) + " | tasks | seeds per task |",
             "|---" * (len(metrics) + 3) + "|"]
    for m in al.methods:
        p, c = st["point"][m], st["ci"][m]
        cells = [_ci(p[i], c[0, i], c[1, i], len(al.seeds[m]) == 1) for i in range(len(metrics))]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {len(al.tasks)} | {len(al.seeds[m])} |")
        data["methods"][m] = {
            "seeds": al.seeds[m], "n_tasks": len(al.tasks), "n_runs": int(st["final"][m].size),
            **{name.lower().replace(" ", "_"): [float(p[i]), float(c[0, i]), float(c[1, i])] for i,
               name in enumerate(metrics)},
            "iqm_curve": {"x": al.x.tolist(), "point": st["curve_point"][m].tolist(),
                          "lo": st["curve_ci"][m][0].tolist(), "hi": st["curve_ci"][m][1].tolist()},
        }
    return lines


def _improvement_section(al: Aligned, st: dict[str, Any], baseline: str, data: dict[str, Any]) -> list[str]:
    if not st["poi_point"]:
        return []
    lines = ["", f"## Probability of improvement over `{baseline}`", "",
             f"P(X > {baseline}): the probability that a run of X on a task scores higher than a run of "
             f"{baseline} on the same task, averaged over tasks.", "",
             "| method X | P(X > baseline) |", "|---|---|"]
    data["probability_of_improvement"] = {}
    for pair, p in st["poi_point"].items():
        m = pair.split(PAIR)[0]
        lo, hi = np.ravel(st["poi_ci"][pair])
        one_seed = len(al.seeds[m]) == 1 or len(al.seeds[baseline]) == 1  # that side is never resampled
        lines.append(f"| {m} | {_ci(float(p), lo, hi, one_seed)} |")
        data["probability_of_improvement"][m] = [float(p), float(lo), float(hi)]
    return lines


def _per_task_section(al: Aligned, st: dict[str, Any]) -> list[str]:
    lines = ["", "## Final score per task (mean ± std over seeds)", "",
             "| method | " + " | ".join(al.tasks) + " |", "|---" * (len(al.tasks) + 1) + "|"]
    for m in al.methods:
        f = st["final"][m]
        lines.append(f"| {m} | " + " | ".join(_mean_sd(f[:, j]) for j in range(len(al.tasks))) + " |")
    return lines


def _mean_sd(values: np.ndarray) -> str:
    """``mean ± std``; one seed has no spread: its value alone."""
    if len(values) == 1:
        return _digits(float(values[0]))[0]
    return " ± ".join(_digits(float(values.mean()), float(values.std(ddof=1))))


def _first_last_section(al: Aligned, kind: RunKind, data: dict[str, Any]) -> list[str]:
    n, a, b = kind.window, kind.score, kind.test
    lines = ["", f"## First {n} and last {n} evaluations (mean ± std over seeds and {kind.x}s)", "",
             f"| method | {a}, first {n} | {a}, last {n} | {b}, first {n} | {b}, last {n} |",
             "|---|---|---|---|---|"]
    data["first_last"] = {}
    for m in al.methods:
        row: dict[str, Any] = {}
        for split, arrays in (("train", al.scores), ("test", al.test)):
            for part, sl in (("first", slice(0, n)), ("last", slice(-n, None))):
                per_run = np.nanmean(arrays[m][..., sl], axis=-1).ravel() if np.isfinite(arrays[m]).any() else None
                row[f"{split}_{part}"] = None if per_run is None else \
                    [float(per_run.mean()), float(per_run.std(ddof=1) if len(per_run) > 1 else 0.0)]
        cells = ["—" if v is None else " ± ".join(_digits(*v)) for v in row.values()]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
        data["first_last"][m] = row
    return lines


def diagnostic_values(study: Study, tags: Sequence[str]
                      ) -> tuple[dict[str, dict[str, dict[str, list[float]]]], list[str]]:
    """``{tag: {method: {task: [final value per seed]}}}`` from the runs' TensorBoard events, and
    one note per tag and method naming the seeds that never logged it; a tag no run logged is a
    one-line error naming some that were."""
    from sac_spectral.studies.events import final_values, logged_tags

    out: dict[str, dict[str, dict[str, list[float]]]] = {t: {} for t in tags}
    lacking: dict[tuple[str, str], list[str]] = {}
    for curve in study.curves:
        index = curve.seed - int(read_mapping(curve.run / CONFIG_FILE).get("seed", curve.seed))
        values = final_values(curve.run, tags, index)
        for tag in tags:
            if tag in values:
                out[tag].setdefault(curve.method, {}).setdefault(curve.task, []).append(values[tag])
            else:
                lacking.setdefault((tag, curve.method), []).append(f"seed {curve.seed} ({curve.run})")
    missing = [t for t, by in out.items() if not by]
    if missing:
        known = sorted({t for run in dict.fromkeys(c.run for c in study.curves) for t in logged_tags(run)})
        raise ConfigError(f"--diagnostics: no run logged {', '.join(missing)}; {_closest(missing, known)}")
    notes = [f"`{tag}`: {method} lacks it for {', '.join(seeds)}; its cell "
             f"{'uses the other seeds' if out[tag].get(method) else 'is empty'}"
             for (tag, method), seeds in lacking.items()]
    return out, notes


#: logged tags an unknown ``--diagnostics`` tag's error lists in full; beyond, only the closest
SHOWN_TAGS = 12


def _closest(missing: Sequence[str], known: Sequence[str]) -> str:
    """The logged tags, or where there are many the few closest to the ``missing`` ones."""
    if len(known) <= SHOWN_TAGS:
        return f"the runs logged {', '.join(known)}" if known else "the runs logged no TensorBoard scalars"
    close = dict.fromkeys(t for m in missing for t in get_close_matches(m, known, n=5, cutoff=0.5))
    if close:
        return f"closest of the {len(known)} logged tags: {', '.join(close)}"
    groups = sorted({t.split("/")[0] for t in known})
    return f"none of the {len(known)} logged tags is close; they start with {', '.join(groups)}"


def _diagnostics_section(study: Study, tags: Sequence[str], reps: int, seed: int, data: dict[str, Any],
                         notes: list[str]) -> list[str]:
    """Final diagnostics per method: IQM over tasks × seeds with 95 % stratified-bootstrap CIs; the
    seeds that lack a diagnostic are added to ``notes``."""
    from rliable import metrics

    values, lacking = diagnostic_values(study, tags)
    notes += lacking
    methods = list(dict.fromkeys(c.method for c in study.curves))
    lines = ["", "## Diagnostics at the end of training (IQM over tasks × seeds, 95 % CI)", "",
             "| method | " + " | ".join(f"`{t}`" for t in tags) + " |", "|---" * (len(tags) + 1) + "|"]
    data["diagnostics"] = {}
    for m in methods:
        cells, row = [], {}
        for tag in tags:
            by_task = values[tag].get(m, {})
            n = min((len(v) for v in by_task.values()), default=0)
            if n == 0:
                cells.append("—")
                continue
            arr = np.array([v[:n] for v in by_task.values()]).T  # [seeds, tasks]
            point, interval = interval_estimates({m: arr}, lambda s: np.array([metrics.aggregate_iqm(s)]), reps, seed)
            row[tag] = [float(point[m][0]), float(interval[m][0, 0]), float(interval[m][1, 0])]
            cells.append(_ci(*row[tag], one_seed=n == 1))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
        data["diagnostics"][m] = row
    return lines


def _priming_section(study: Study, data: dict[str, Any]) -> list[str]:
    primed = priming_diagnostics(study)
    if not primed:
        return []
    keys = list(dict.fromkeys(k for d in primed.values() for k in d))
    lines = ["", "## Heavy priming: diagnostics before → after the priming updates (mean over seeds)", "",
             "| method | " + " | ".join(f"`{k}`" for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for m, d in primed.items():
        cells = [f"{np.mean(d[k][0]):.3g} → {np.mean(d[k][1]):.3g}" if k in d else "—" for k in keys]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    data["priming"] = primed
    return lines + _predictors_section(study, data)


def _predictors_section(study: Study, data: dict[str, Any]) -> list[str]:
    """Spearman's rank correlation of each diagnostic after priming with the final score, over
    every seed of every primed run (every method together)."""
    lines, data["priming_correlation"] = correlation_table(
        priming_predictors(study), "Rank correlation of each diagnostic after priming with the final score (Spearman, "
        "every seed of every primed run):", "runs", "runs")
    if not lines:
        del data["priming_correlation"]
    return lines


CAPTIONS = {
    "iqm_curves.png": "IQM of the score over training (all tasks × seeds) with 95 % CI bands (task sequences: switches "
                      "dashed)",
    "per_task_curves.png": "each task: mean over seeds with 95 % bootstrap CI",
    "final_scores.png": "final median, IQM, mean (and optimality gap) with 95 % CIs; the bar is the CI, the tick the "
                        "point estimate",
    "probability_of_improvement.png": "P(X > {baseline}) with 95 % CIs; right of 0.5 = X tends to beat the baseline",
    "performance_profile.png": "fraction of runs whose final score exceeds τ, with 95 % CI bands; a curve above "
                               "another dominates it",
    "accuracy_per_task.png": "end-of-task train (and test) accuracy by task index, mean ± std over seeds",
    "continual_tasks.png": "task sequences: each task over the whole run, the switches dashed with each stage's index "
                           "and "
                           "task, evaluations in a warm-up hollow (several tasks: each task's own stages shaded)",
}


def write_report(study: Study, al: Aligned, st: dict[str, Any], out: Path, baseline: str, pngs: list[str],
                 reps: int, sources: Sequence[str], cautions: list[str], diagnostics: Sequence[str] = (),
                 seed: int = 0, seqs: Sequences | None = None, reference: str = "reset_all") -> dict[str, Any]:
    """Write ``report.md`` and ``report.json``; returns what ``report.json`` holds."""
    metrics = list(METRICS) if study.normalized else list(METRICS[:3])
    data: dict[str, Any] = {"kind": study.kind.name, "score": _score_name(study), "tasks": al.tasks,
                            "final_x": float(al.x[-1]), "reps": reps, "baseline": baseline, "methods": {},
                            "warnings": cautions}
    notes = al.notes + study.missing
    lines = _header(study, al, reps, sources, cautions)
    lines += _aggregate_section(al, st, metrics, data)
    lines += _improvement_section(al, st, baseline, data)
    lines += _per_task_section(al, st)
    if study.kind.window > 1 and study.kind.test:
        lines += _first_last_section(al, study.kind, data)
    lines += _priming_section(study, data)
    if seqs is not None:
        lines += continual_section(seqs, lambda scores, func: interval_estimates(scores, func, reps, seed), data,
                                   reference)
        lines += switch_section(study, data)
        lines += mechanism.switch_section(study, data)
    lines += mechanism.value_section(study, seqs or Sequences(), data)
    if diagnostics:
        lines += _diagnostics_section(study, diagnostics, reps, seed, data, notes)
    lines += ["", "## What was cut or missing", ""]
    lines += [f"- {note}" for note in notes] or ["- nothing"]
    lines += ["", "## Figures", ""]
    lines += [f"- `{name}`: {CAPTIONS[name].format(baseline=baseline)}\n\n  ![{name}]({name})" for name in pngs]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    data["notes"] = notes
    (out / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    return data


def few_seeds(al: Aligned) -> str | None:
    """``few seeds per task (m n, …)`` for methods with fewer than :data:`MIN_SEEDS` seeds per task, or None."""
    few = {m: len(s) for m, s in al.seeds.items() if len(s) < MIN_SEEDS}
    if not few:
        return None
    return f"few seeds per task ({', '.join(f'{m}: {n}' for m, n in few.items())}; fewer than {MIN_SEEDS})"


def report_warnings(study: Study, al: Aligned) -> list[str]:
    """What makes the report's numbers less trustworthy: few seeds, runs left out for non-finite scores."""
    few = few_seeds(al)
    unreliable = (f"{few}: with a handful of runs per task the bootstrap confidence intervals are unreliable "
                  "(Agarwal et al., 2021, rliable's guidance); read them as rough and add seeds")
    return ([unreliable] if few else []) + study.warnings


def resolve_baseline(name: str | None, methods: list[str]) -> str:
    """The method named ``name`` (default: the first). Where several sweeps are merged, methods are
    named ``<sweep>/<method>``, and ``<method>`` alone names the one method it ends."""
    if name is None:
        return methods[0]
    matches = [name] if name in methods else [m for m in methods if m.endswith(f"/{name}")]
    if len(matches) != 1:
        why = "names several methods" if matches else "is not one of the methods"
        raise ConfigError(f"--baseline '{name}' {why}: {', '.join(matches or methods)}")
    return matches[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sac_spectral.report", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="RUN_OR_SWEEP_DIR",
                        help="run directories, sweep directories or folders holding them")
    parser.add_argument("--out", help="output folder (default: <first dir>/report)")
    parser.add_argument("--baseline", help="method the others are compared with (default: the first)")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples (default: 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default: 0)")
    parser.add_argument("--fresh-reference", default="reset_all", metavar="METHOD",
                        help="task sequences: the method whose networks are fresh at every switch, against which "
                             "plasticity is measured (default: reset_all)")
    parser.add_argument("--diagnostics", nargs="+", default=[], metavar="TAG",
                        help="also tabulate these logged diagnostics' final values per method (IQM with 95 %% CIs), "
                             "e.g. features/critic/stable_rank active/critic/fraction")
    args = parser.parse_args(argv)
    if not 0 <= args.seed < 2**32:
        raise ConfigError(f"--seed must be an integer in 0 .. 2**32 - 1 (numpy's seeds), got {args.seed}")
    if importlib.util.find_spec("rliable") is None or importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("the report needs rliable and matplotlib; pip install -e '.[report]'")
    if args.reps < 1:
        raise ConfigError(f"--reps must be >= 1, got {args.reps}")
    study = load(args.dirs)
    al = align(study)
    baseline = resolve_baseline(args.baseline, al.methods)
    out = Path(args.out) if args.out else Path(args.dirs[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    st = compute_statistics(al, study.kind, baseline, args.reps, args.seed)
    few = few_seeds(al)
    seqs = read_sequences(study)
    pngs = figures(al, st, study.kind, out, study.normalized, few and f"{few}: bootstrap CIs unreliable", seqs.marks)
    pngs += continual_figures(seqs, method_colors(al.methods), out, _score_name(study))
    cautions = report_warnings(study, al)
    data = write_report(study, al, st, out, baseline, pngs, args.reps, args.dirs, cautions, args.diagnostics, args.seed,
                        seqs, args.fresh_reference)
    for w in cautions:
        print(f"warning: {w}", file=sys.stderr)
    for m, d in data["methods"].items():
        iqm = _ci(*d["iqm"], one_seed=len(d["seeds"]) == 1)
        print(f"{m:>24}: IQM {iqm}  ({d['n_tasks']} task(s) × {len(d['seeds'])} seed(s))")
    print(f"report: {out / 'report.md'}")
    return 0
