"""Loss of trainability across tasks, with and without regularizers: the table of the closing note.

    python benchmarks/plasticity_table.py [--methods none l2 l2_init shrink_perturb spectral]
        [--seeds 0 1 2] [--config run_configs/continual_default.yaml] [--out DIR]
        [--spec 'l2={name: l2, coef: 1e-3}' ...] [key=value ...]

Runs ``python -m sac_spectral.continual``'s loop in this process for every method and seed (one
thread each, one after the other) and prints the mean end-of-task training accuracy over the
first 5 and the last 5 tasks (mean ± std over seeds, and each seed's last-5 value). ``none`` trains
without regularizers; every other method is a registered regularizer, used with the
configuration's entry of that name if it has one, else with its own defaults, unless ``--spec``
gives its entry. ``key=value`` overrides, anywhere on the command line, apply to every run.
Every run keeps its run directory
under ``--out`` (default ``runs/plasticity_table__<time>``) for TensorBoard, and the table is also
written to ``<out>/table.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from sac_spectral.config import ConfigError, merge_sources, read_yaml, yaml_load
from sac_spectral.continual import SUMMARY_TASKS, ContinualConfig, ContinualRunner
from sac_spectral.regularizers import REGISTRY
from sac_spectral.runs import GracefulStop, parse_cli, release_run_dirs

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["none", "l2", "l2_init", "shrink_perturb", "spectral"]


def parse_specs(items: list[str]) -> dict[str, dict[str, Any]]:
    """``method={name: …, coef: …}`` → ``{method: entry}``."""
    out = {}
    for item in items:
        method, sep, text = item.partition("=")
        entry = yaml_load(text) if sep else None
        if not isinstance(entry, dict) or "name" not in entry:
            raise ConfigError(f"--spec '{item}' is not of the form method={{name: …, coef: …}}")
        out[method] = entry
    return out


def method_entries(
    methods: list[str], base: list[dict[str, Any]], specs: dict[str, dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Regularizer list per method; stops with one line naming methods that are not registered."""
    missing = [m for m in methods if m != "none" and (specs.get(m) or {"name": m})["name"] not in REGISTRY]
    if missing:
        raise ConfigError(
            f"regularizer(s) not registered: {', '.join(missing)} (registered: {', '.join(sorted(REGISTRY))}); "
            "merge the branch that adds them or choose --methods among: none " + " ".join(sorted(REGISTRY))
        )
    out = {}
    for m in methods:
        if m == "none":
            out[m] = []
        elif m in specs:
            out[m] = [specs[m]]
        else:
            out[m] = [next((dict(e) for e in base if e.get("name") == m), {"name": m})]
    return out


def run_one(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    cfg = merge_sources(ContinualConfig, data, overrides)
    runner = ContinualRunner(cfg)
    try:
        runner.open_new()
        with GracefulStop() as stop, contextlib.redirect_stdout(io.StringIO()):
            code = runner.train(stop)
    finally:
        release_run_dirs()
    if code != 0:
        raise SystemExit(code)
    return runner.summary()


def fmt(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--config", default=str(ROOT / "run_configs" / "continual_default.yaml"))
    parser.add_argument("--out", default=None, help="parent folder of the runs' directories")
    parser.add_argument("--spec", action="append", default=[], metavar="METHOD={name: …}")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parse_cli(parser, None, ("--config", "--out", "--spec"))
    torch.set_num_threads(1)
    try:
        base = read_yaml(args.config)
        entries = method_entries(args.methods, merge_sources(ContinualConfig, base, args.overrides).regularizers,
                                 parse_specs(args.spec))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out or f"runs/plasticity_table__{datetime.now():%Y%m%d-%H%M%S}")
    n = SUMMARY_TASKS
    rows = []
    for method, regs in entries.items():
        firsts, lasts, times = [], [], []
        for seed in args.seeds:
            data = {**base, "seed": seed, "regularizers": regs, "run_dir": str(out / f"{method}__s{seed}"),
                    "progress": False, "threads": 1}
            t0 = time.perf_counter()
            try:
                summary = run_one(data, args.overrides)
            except ConfigError as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
            times.append(time.perf_counter() - t0)
            firsts.append(summary[f"first{n}_train_acc"])
            lasts.append(summary[f"last{n}_train_acc"])
            print(f"{method:>15} seed {seed}: first {n} {firsts[-1]:.3f}, last {n} {lasts[-1]:.3f} "
                  f"({times[-1]:.0f} s)", file=sys.stderr, flush=True)
        rows.append({"method": method, "regularizers": regs, "first": firsts, "last": lasts, "seconds": times})
    cfg = merge_sources(ContinualConfig, base, args.overrides)
    print(f"\n{cfg.dataset.name} {cfg.stream.kind}: {cfg.stream.num_tasks} tasks × {cfg.stream.iters_per_task} "
          f"iterations, {cfg.model.name} {cfg.model.depth}×{cfg.model.width}, {cfg.optimizer.name} lr {cfg.optimizer.lr}, "
          f"batch {cfg.batch_size}; seeds {args.seeds}")
    print("mean end-of-task train accuracy (mean ± std over seeds)\n")
    print(f"| method | regularizer | first {n} tasks | last {n} tasks | last/first | last {n} per seed |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        spec = ", ".join(json.dumps(e, separators=(",", ":")) for e in r["regularizers"]) or "—"
        ratio = statistics.mean(r["last"]) / max(statistics.mean(r["first"]), 1e-12)
        per_seed = " ".join(f"{v:.3f}" for v in r["last"])
        print(f"| {r['method']} | `{spec}` | {fmt(r['first'])} | {fmt(r['last'])} | {ratio:.2f} | {per_seed} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"\nruns and table.json in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
