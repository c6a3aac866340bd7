"""The report's figures (matplotlib): IQM and per-task curves, final aggregate scores, probability of
improvement, performance profiles, continual accuracy per task. Every axis gets a few ticks
(``MaxNLocator``) and limits padded around its data, so that the figures read the same whether
the scores span 0.003–0.012 or 0–1000; intervals narrower than a line still show their point."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sac_spectral.runs.kinds import RunKind
from sac_spectral.studies.results import Aligned

METRICS = ("Median", "IQM", "Mean", "Optimality Gap")
PAIR = ";"
STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


#: more curves than this in one axes: their legend goes beside the axes instead of over the data
LEGEND_INSIDE = 6


def method_colors(methods: Sequence[str]) -> dict[str, Any]:
    """A colour per method: tab10, or tab20 (pairs of a dark and a light shade, so that no two of up
    to 20 methods share one) when there are more than 10; beyond 20 the palette repeats."""
    import matplotlib

    if len(methods) <= 10:
        cmap, n = matplotlib.colormaps["tab10"], 10
    else:
        cmap, n = matplotlib.colormaps["tab20"], 20
    return {m: cmap(i % n) for i, m in enumerate(methods)}


def _band_alpha(curves: int, alpha: float) -> float:
    """The opacity of each CI band: lighter as more bands overlap, so the lines stay readable."""
    return alpha if curves <= LEGEND_INSIDE else alpha / 2


def _legend(ax: Any, curves: int) -> None:
    """The legend over the axes for a few curves; beside it, right of the plot, for many."""
    if curves <= LEGEND_INSIDE:
        ax.legend(fontsize="medium")
    else:
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5))


def _style(i: int) -> dict[str, Any]:
    """A line style and marker per curve, so that curves drawn on top of each other stay apart."""
    return {"linestyle": STYLES[i % len(STYLES)], "marker": MARKERS[i % len(MARKERS)]}


def padded(lo: float, hi: float, frac: float = 0.08) -> tuple[float, float]:
    """Axis limits around ``[lo, hi]`` with a margin (a point gets a margin of its own size)."""
    span = hi - lo
    if span <= 0:
        span = abs(hi) or 1.0
    return lo - frac * span, hi + frac * span


def _few_ticks(ax: Any, x: int = 4, y: int | None = 5) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(x))
    if y is not None:
        ax.yaxis.set_major_locator(MaxNLocator(y))


#: a task sequence's stages as the figures mark them: each stage's task, and the env steps per stage
Stages = tuple[Sequence[str], int]
#: more stages than this: the switches are marked, the stages not labelled
LABELLED_STAGES = 8
#: inches of figure width a labelled stage takes
STAGE_WIDTH = 1.3


def stages_width(stages: Stages | None) -> float:
    """The figure width (inches) that labels of ``stages`` need (0 where they are not labelled)."""
    return STAGE_WIDTH * len(stages[0]) if stages is not None and len(stages[0]) <= LABELLED_STAGES else 0.0


def mark_stages(ax: Any, stages: Stages) -> None:
    """Dashed lines at a sequence's switches and, for a few stages, ``stage <index>`` and its task
    atop each (in room added above the data)."""
    names, steps = stages
    for s in range(1, len(names)):
        ax.axvline(s * steps, color="0.5", linestyle="--", linewidth=0.8, zorder=1)
    if stages_width(stages):
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi + 0.18 * (hi - lo))
        for s, name in enumerate(names):
            ax.text((s + 0.5) * steps, 0.98, f"stage {s}\n{name}", transform=ax.get_xaxis_transform(), ha="center",
                    va="top", fontsize="x-small", color="0.35", clip_on=True)


def iqm_curves(al: Aligned, st: dict[str, Any], colors: dict[str, Any], xlabel: str, score: str,
               stages: Stages | None = None) -> Any:
    """IQM over tasks × seeds at each step, with the switches of a task sequence (``stages``) dashed."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(7.0, stages_width(stages)), 4.5))
    for i, m in enumerate(al.methods):
        ax.plot(al.x, st["curve_point"][m], color=colors[m], label=m, markevery=max(1, len(al.x) // 10), **_style(i))
        ax.fill_between(al.x, *st["curve_ci"][m], color=colors[m], alpha=_band_alpha(len(al.methods), 0.2))
    _few_ticks(ax, 5)
    if stages is not None:
        mark_stages(ax, stages)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"IQM {score}")
    ax.grid(alpha=0.3)
    _legend(ax, len(al.methods))
    ax.set_title(f"IQM over {len(al.tasks)} task(s) × seeds, 95 % stratified-bootstrap CI"
                 + ("; task switches dashed" if stages is not None else ""))
    return fig


def per_task_curves(al: Aligned, st: dict[str, Any], colors: dict[str, Any], xlabel: str, score: str) -> Any:
    import matplotlib.pyplot as plt

    cols = min(3, len(al.tasks))
    rows = -(-len(al.tasks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.4 * rows), squeeze=False)
    for j, task in enumerate(al.tasks):
        ax = axes[j // cols][j % cols]
        for i, m in enumerate(al.methods):
            point, ci = st["task_mean"][m]
            ax.plot(al.x, point[j], color=colors[m], label=m, markevery=max(1, len(al.x) // 10), **_style(i))
            ax.fill_between(al.x, ci[0, j], ci[1, j], color=colors[m], alpha=0.2)
        _few_ticks(ax, 4)
        ax.set_title(task, fontsize="medium")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"mean {score}")
        ax.grid(alpha=0.3)
    for j in range(len(al.tasks), rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle("per task: mean over seeds, 95 % bootstrap CI")
    fig.tight_layout()
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return fig


def _intervals(ax: Any, rows: Sequence[str], point: np.ndarray, lo: np.ndarray, hi: np.ndarray,
               colors: Sequence[Any]) -> None:
    """One horizontal CI bar per row with its point estimate as a marker (visible for any width)."""
    y = np.arange(len(rows))[::-1]
    ax.barh(y, hi - lo, left=lo, height=0.6, color=colors, alpha=0.6)
    ax.scatter(point, y, marker="|", s=300, color="k", zorder=3)
    ax.set_yticks(y, rows)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlim(*padded(float(np.min(lo)), float(np.max(hi))))
    ax.grid(axis="x", alpha=0.3)


def final_scores(al: Aligned, st: dict[str, Any], colors: dict[str, Any], score: str, normalized: bool) -> Any:
    import matplotlib.pyplot as plt

    metrics = list(METRICS) if normalized else list(METRICS[:3])
    names = max(len(m) for m in al.methods)
    fig, axes = plt.subplots(1, len(metrics), figsize=(0.08 * names + 2.9 * len(metrics), 0.45 * len(al.methods) + 1.4),
                             squeeze=False)
    for k, metric in enumerate(metrics):
        ax = axes[0][k]
        point = np.array([st["point"][m][k] for m in al.methods])
        lo, hi = (np.array([st["ci"][m][b, k] for m in al.methods]) for b in (0, 1))
        _intervals(ax, al.methods, point, lo, hi, [colors[m] for m in al.methods])
        _few_ticks(ax, 4, None)
        ax.set_title(metric, fontsize="medium")
        ax.set_xlabel("optimality gap (lower is better)" if metric == "Optimality Gap" else f"{metric} final {score}",
                      fontsize="small")
        if k:
            ax.tick_params(labelleft=False)
    fig.suptitle("final scores: 95 % stratified-bootstrap CI (bar), point estimate (tick)", fontsize="medium")
    fig.tight_layout()
    return fig


def improvement(st: dict[str, Any], colors: dict[str, Any]) -> Any:
    import matplotlib.pyplot as plt

    pairs = list(st["poi_point"])
    methods, baseline = [p.split(PAIR)[0] for p in pairs], pairs[0].split(PAIR)[1]
    point = np.array([float(st["poi_point"][p]) for p in pairs])
    lo, hi = (np.array([float(np.ravel(st["poi_ci"][p])[b]) for p in pairs]) for b in (0, 1))
    fig, ax = plt.subplots(figsize=(0.08 * max(map(len, methods)) + 4.5, 0.5 * len(pairs) + 1.4))
    _intervals(ax, methods, point, lo, hi, [colors[m] for m in methods])
    ax.scatter(point, np.arange(len(pairs))[::-1], marker="o", s=25, color="k", zorder=4)
    ax.set_xlim(-0.03, 1.03)
    ax.set_xticks([0.0, 0.25, 0.5, 0.75, 1.0])
    ax.axvline(0.5, color="k", linestyle=":", alpha=0.5)
    ax.set_xlabel(f"P(method X > {baseline})")
    ax.set_ylabel("method X")
    ax.set_title(f"Probability of improvement over {baseline} (95 % CI)", fontsize="medium")
    fig.tight_layout()
    return fig


def performance_profile(al: Aligned, st: dict[str, Any], colors: dict[str, Any], score: str) -> Any:
    import matplotlib.pyplot as plt

    taus = st["taus"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, m in enumerate(al.methods):
        ax.plot(taus, st["prof_point"][m], color=colors[m], label=m, markevery=max(1, len(taus) // 8), **_style(i))
        ax.fill_between(taus, *st["prof_ci"][m], color=colors[m], alpha=_band_alpha(len(al.methods), 0.15))
    ax.set_xlim(taus[0], taus[-1])
    ax.set_ylim(-0.03, 1.03)
    _few_ticks(ax, 5)
    ax.set_xlabel(f"final {score} τ")
    ax.set_ylabel("fraction of runs with score > τ")
    ax.set_title("performance profile, 95 % stratified-bootstrap CI bands", fontsize="medium")
    ax.grid(alpha=0.3)
    _legend(ax, len(al.methods))
    return fig


def accuracy_per_task(al: Aligned, colors: dict[str, Any], kind: RunKind) -> Any:
    """The score (and the held-out score, where measured) at every evaluation, per task."""
    import matplotlib.pyplot as plt

    splits = [("train",
               al.scores)] + ([("test", al.test)] if any(np.isfinite(a).any() for a in al.test.values()) else [])
    fig, axes = plt.subplots(len(al.tasks), len(splits), figsize=(6 * len(splits), 3.6 * len(al.tasks)), squeeze=False)
    for j, task in enumerate(al.tasks):
        for k, (split, arrays) in enumerate(splits):
            ax = axes[j][k]
            for i, m in enumerate(al.methods):
                a = arrays[m][:, j]
                mean, sd = np.nanmean(a, axis=0), np.nanstd(a, axis=0)
                ax.plot(al.x, mean, color=colors[m], label=m, markevery=max(1, len(al.x) // 10), **_style(i))
                ax.fill_between(al.x, mean - sd, mean + sd, color=colors[m], alpha=0.2)
            _few_ticks(ax, 5)
            ax.set_title(f"{task}: {kind.score if split == 'train' else kind.test} (mean ± std over seeds)",
                         fontsize="medium")
            ax.set_xlabel(kind.x_label)
            ax.set_ylabel(kind.score if split == "train" else str(kind.test))
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    return fig


def build_figures(al: Aligned, st: dict[str, Any], kind: RunKind, normalized: bool,
                  caveat: str | None = None, stages: Stages | None = None) -> dict[str, Any]:
    """The report's figures by file name; ``caveat`` (e.g. too few seeds) is printed under each,
    the switches of a task sequence (``stages``) are marked on the IQM curves."""
    import matplotlib

    matplotlib.use("Agg")
    colors = method_colors(al.methods)
    xlabel, score = kind.x_label, kind.score_label if normalized else kind.raw_label
    figs = {"iqm_curves.png": iqm_curves(al, st, colors, xlabel, score, stages),
            "per_task_curves.png": per_task_curves(al, st, colors, xlabel, score),
            "final_scores.png": final_scores(al, st, colors, score, normalized)}
    if st["poi_point"]:
        figs["probability_of_improvement.png"] = improvement(st, colors)
    figs["performance_profile.png"] = performance_profile(al, st, colors, score)
    if kind.window > 1 and kind.test:
        figs["accuracy_per_task.png"] = accuracy_per_task(al, colors, kind)
    if caveat:
        for fig in figs.values():
            fig.text(0.5, 0.0, f"caution: {caveat}", ha="center", va="top", color="firebrick", fontsize="small")
    return figs


def figures(al: Aligned, st: dict[str, Any], kind: RunKind, out: Path, normalized: bool,
            caveat: str | None = None, stages: Stages | None = None) -> list[str]:
    """Write the PNGs; returns their file names."""
    import matplotlib.pyplot as plt

    written = []
    for name, fig in build_figures(al, st, kind, normalized, caveat, stages).items():
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(name)
    return written
