"""The report's figures (matplotlib, rliable's plot helpers): IQM and per-task curves, final
aggregate scores, probability of improvement, performance profiles, continual accuracy per task."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sac_spectral.studies.results import Aligned

METRICS = ("Median", "IQM", "Mean", "Optimality Gap")
PAIR = ";"


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
