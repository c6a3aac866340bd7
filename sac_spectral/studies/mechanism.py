"""The report's mechanism part: what each method's networks looked like where a study asks why.

- **At the task switches** (task sequences that logged diagnostics there, ``summary.json``'s
  ``continual.switches``): the mean over seeds and switches of the gradient effective ranks, the
  critic's feature stable rank and norm, the dormant fractions and every layer's σ_max.
- **The value scale**: the critics' mean Q on their training batches (TensorBoard's ``q/mean``) at
  the end of each stage (the run's last logged value where there are no stages), and, where the run
  measured it (``diagnostics.q_scale``: ``summary.json``) or its directory holds
  :data:`~sac_spectral.runs.layout.MECHANISM` (``python -m sac_spectral.diagnose RUN --q-scale
  EPISODES --json RUN/mechanism.json``), the critics' mean Q on the policy's own evaluation states
  against the discounted Monte-Carlo return of the same episodes, and the normalized bias
  ``(Q − G)/G`` (median and range over seeds), at the end and, where measured, at each switch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from sac_spectral.runs.layout import CONFIG_FILE, MECHANISM
from sac_spectral.studies.results import Study, read_mapping, read_summary
from sac_spectral.studies.sequences import Sequences

#: the switch diagnostics tabulated, with their column names ("%": shown as a percentage)
SWITCH_KEYS = (("grad_rank/critic/erank", "critic grad erank"), ("grad_rank/actor/erank", "actor grad erank"),
               ("features/critic/stable_rank", "critic feature srank"), ("features/critic/norm", "critic feature norm"),
               ("dormant/critic/fraction", "critic dormant %"), ("dormant/actor/fraction", "actor dormant %"))
_SIGMA = re.compile(r"^spectral/(\w+)/layer(\d+)/sigma_max$")


def _runs(study: Study) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for method, run in dict.fromkeys((c.method, c.run) for c in study.curves):
        out.setdefault(method, []).append(run)
    return out


def switch_means(study: Study) -> dict[str, dict[str, float]]:
    """Per method, each switch diagnostic's mean over seeds and switches (σ_max per layer as
    ``sigma_max/<net>/<layer>``)."""
    out: dict[str, dict[str, float]] = {}
    for method, runs in _runs(study).items():
        pooled: dict[str, list[float]] = {}
        for run in runs:
            summary = read_summary(run)
            for switch in (summary.get("continual") or {}).get("switches", []):
                diagnostics = switch.get("diagnostics") or {}
                if diagnostics and not any(map(_SIGMA.match, diagnostics)):
                    diagnostics = {**diagnostics, **logged_sigmas(run, len(summary.get("seeds", [0])), switch["step"])}
                for key, values in diagnostics.items():
                    sigma = _SIGMA.match(key)
                    name = f"sigma_max/{sigma[1]}/{sigma[2]}" if sigma else key
                    if sigma or key in dict(SWITCH_KEYS):
                        pooled.setdefault(name, []).extend(values)
        if pooled:
            out[method] = {k: float(np.nanmean(v)) for k, v in pooled.items()}
    return out


def logged_sigmas(run: Path, num_seeds: int, step: int) -> dict[str, list[float]]:
    """Every layer's σ_max that the run logged with its training metrics at ``step``, per seed (what a
    switch's diagnostics did not record in runs that logged training metrics at the same step)."""
    from sac_spectral.studies.events import logged_tags, series

    out = {}
    for tag in filter(_SIGMA.match, logged_tags(run)):
        values = [series(run, tag, i).get(step) for i in range(num_seeds)]
        if all(v is not None for v in values):
            out[tag] = values
    return out


def _sigmas(means: dict[str, float], net: str) -> str:
    layers = sorted(int(k.rsplit("/", 1)[1]) for k in means if k.startswith(f"sigma_max/{net}/"))
    return " / ".join(f"{means[f'sigma_max/{net}/{i}']:.1f}" for i in layers) or "—"


def switch_section(study: Study, data: dict[str, Any]) -> list[str]:
    """The table of :func:`switch_means` (nothing where no run logged diagnostics at a switch)."""
    means = switch_means(study)
    if not means:
        return []
    header = [name for _, name in SWITCH_KEYS] + ["critic σ_max by layer", "actor σ_max by layer"]
    lines = ["", "## Mechanism at the task switches", "",
             "The agent as each stage left it: the mean over seeds and switches (`summary.json`'s "
             "`continual.switches`).", "", "| method | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for method, m in means.items():
        cells = [("—" if key not in m else f"{100 * m[key]:.0f} %" if name.endswith("%") else f"{m[key]:.1f}")
                 for key, name in SWITCH_KEYS]
        lines.append(f"| {method} | " + " | ".join(cells + [_sigmas(m, "critic"), _sigmas(m, "actor")]) + " |")
    data["mechanism_switches"] = means
    return lines


def _seed_indices(run: Path, summary: dict[str, Any]) -> list[int]:
    seeds = summary.get("seeds")
    if seeds:
        return list(range(len(seeds)))
    return list(range(int(read_mapping(run / CONFIG_FILE).get("num_seeds", 1))))


def stage_q(run: Path, seed_index: int, ends: list[int]) -> list[float | None]:
    """Seed ``seed_index``'s ``q/mean`` at each stage end of ``ends`` (the last value logged after
    the previous end and at or before this one; the last value of the run where ``ends`` is empty)."""
    from sac_spectral.studies.events import last_in, series

    if not ends:
        logged = series(run, "q/mean", seed_index)
        return [logged[max(logged)]] if logged else [None]
    return [last_in(run, "q/mean", seed_index, start, end) for start, end in zip([0, *ends[:-1]], ends)]


def _end_q_scale(run: Path, summary: dict[str, Any]) -> dict[str, list[float]]:
    """The run's value scale at its end: ``summary.json``'s (``diagnostics.q_scale``), else its
    :data:`~sac_spectral.runs.layout.MECHANISM` file's, else nothing."""
    if summary.get("q_scale"):
        return summary["q_scale"]
    return read_mapping(run / MECHANISM).get("values", {}) if (run / MECHANISM).is_file() else {}


def value_scale(study: Study, seqs: Sequences) -> dict[str, dict[str, Any]]:
    """Per method: ``stage_q`` (the mean over seeds of :func:`stage_q`); per seed, the value scale at
    the end (:func:`_end_q_scale`) as ``q``, ``mc_return`` and ``bias``; and ``stage_bias``, the median
    over seeds of the normalized bias at each switch (where the runs measured it there) and at the end."""
    ends = [(i + 1) * seqs.steps_per_task for i in range(len(seqs.stages))] if seqs.stages and not seqs.mixed else []
    out: dict[str, dict[str, Any]] = {}
    for method, runs in _runs(study).items():
        per_seed: list[list[float | None]] = []
        q_scale: dict[str, list[float]] = {"q": [], "mc_return": [], "bias": []}
        at_switch: dict[int, list[float]] = {}
        for run in runs:
            summary = read_summary(run)
            per_seed += [stage_q(run, i, ends) for i in _seed_indices(run, summary)]
            end = _end_q_scale(run, summary)
            for key, name in (("q_scale/q_mean", "q"), ("q_scale/mc_return", "mc_return"),
                              ("q_scale/normalized_bias", "bias")):
                q_scale[name] += end.get(key, [])
            for switch in (summary.get("continual") or {}).get("switches", []):
                if switch.get("q_scale"):
                    at_switch.setdefault(int(switch["stage"]), []).extend(switch["q_scale"]["q_scale/normalized_bias"])
        stage = [float(np.mean(v)) if (v := [q[i] for q in per_seed if q[i] is not None]) else None
                 for i in range(max(map(len, per_seed), default=0))]
        biases = [float(np.median(at_switch[k])) for k in sorted(at_switch)]
        if biases and q_scale["bias"]:
            biases.append(float(np.median(q_scale["bias"])))
        if any(v is not None for v in stage) or q_scale["q"]:
            out[method] = {"stage_q": stage, **q_scale, "stage_bias": biases}
    return out


def value_section(study: Study, seqs: Sequences, data: dict[str, Any]) -> list[str]:
    """The table of :func:`value_scale` (nothing where no run logged ``q/mean``)."""
    scale = value_scale(study, seqs)
    if not scale:
        return []
    staged = bool(seqs.stages) and not seqs.mixed
    q_col = "critics' mean Q at the end of each stage" if staged else "critics' mean Q at the end"
    lines = ["", "## The value scale", "",
             "The critics' mean Q on their training batches (`q/mean`, mean over seeds); where a run holds "
             f"`{MECHANISM}` (`python -m sac_spectral.diagnose RUN --q-scale 5 --json RUN/{MECHANISM}`), their mean Q "
             "on the policy's evaluation states against the discounted Monte-Carlo return G of the same states.", "",
             f"| method | {q_col} | Q on the policy's states | G | (Q − G) / G, median (range) |",
             "|---|---|---|---|---|"]
    staged_bias = any(s["stage_bias"] for s in scale.values())
    if staged_bias:
        lines[-2] += " (Q − G) / G at the end of each stage, median |"
        lines[-1] += "---|"
    for method, s in scale.items():
        stage = " / ".join("—" if v is None else f"{v:.0f}" for v in s["stage_q"]) or "—"
        if s["q"]:
            bias = s["bias"]
            tail = (f"{np.mean(s['q']):.0f} | {np.mean(s['mc_return']):.0f} | {np.median(bias):+.2f} "
                    f"({min(bias):+.2f} … {max(bias):+.2f})")
        else:
            tail = "— | — | —"
        if staged_bias:
            tail += " | " + (" / ".join(f"{v:+.2f}" for v in s["stage_bias"]) or "—")
        lines.append(f"| {method} | {stage} | {tail} |")
    data["value_scale"] = scale
    return lines
