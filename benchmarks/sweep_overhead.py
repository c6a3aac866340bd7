"""Overhead of running trials through the sweep (local Ray instance, status file, one process per
trial) against launching the same runs directly, with the same concurrency.

    python -m benchmarks.sweep_overhead [--total-steps 12000] [--trials 4] [--concurrency 2] [--repeats 1]

Each repeat runs, one after the other: the ``--trials`` runs as plain ``python -m
sac_spectral.train`` processes, ``--concurrency`` at a time (a new one starts when one ends), and a
sweep of the same runs (``--num-cpus`` = concurrency, 1 CPU per trial, so the same number run at a
time), timed from launch to exit (Ray start-up and shutdown included). Prints the wall times and
their ratio (median over repeats), with the machine's load average. The target is ≤ 1.10 for
trials of about 2 minutes (``--total-steps 12000`` on one idle CPU thread).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def run_config(total_steps: int) -> dict:
    """Plain SAC on cheetah-run, evaluated once at the end, no diagnostics."""
    return {"env": "dmc:cheetah-run", "total_steps": total_steps, "random_steps": 1000, "eval_every": 0,
            "eval_episodes": 1, "diagnostics": {"every": 0}, "checkpoint_every": 0,
            "actor": {"regularizers": []}, "critic": {"regularizers": []}}


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def direct(base: Path, out: Path, trials: int, concurrency: int) -> float:
    """Wall time of ``trials`` direct runs, ``concurrency`` at a time."""
    commands = [[sys.executable, "-m", "sac_spectral.train", "--config", str(base), f"seed={i}",
                 f"run_dir={out / f's{i}'}", "threads=1", "progress=false"] for i in range(trials)]
    start, running = time.perf_counter(), []
    while commands or running:
        while commands and len(running) < concurrency:
            running.append(subprocess.Popen(commands.pop(0), cwd=ROOT, env=env(), stdout=subprocess.DEVNULL))
        for proc in list(running):
            if proc.poll() is not None:
                if proc.returncode != 0:
                    raise SystemExit(f"a direct run failed with exit code {proc.returncode}")
                running.remove(proc)
        time.sleep(0.05)
    return time.perf_counter() - start


def swept(base: Path, out: Path, trials: int, concurrency: int) -> float:
    """Wall time of the sweep of the same runs, from launch to exit."""
    spec = {"kind": "train", "name": "overhead", "base": str(base), "methods": {"sac": {}},
            "seeds": list(range(trials)), "resources_per_trial": {"cpu": 1}}
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sac_spectral.sweep", "--config", str(path), "--out", str(out),
                    "--num-cpus", str(concurrency), "--no-progress"], cwd=ROOT, env=env(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total-steps", type=int, default=12_000, help="env steps per trial (12000 ≈ 2 min idle)")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.yaml"
        base.write_text(yaml.safe_dump(run_config(args.total_steps)))
        times: dict[str, list[float]] = {"direct": [], "sweep": []}
        for r in range(args.repeats):
            times["direct"].append(direct(base, Path(tmp) / f"direct{r}", args.trials, args.concurrency))
            times["sweep"].append(swept(base, Path(tmp) / f"sweep{r}", args.trials, args.concurrency))
            print(f"repeat {r}: direct {times['direct'][-1]:.1f} s, sweep {times['sweep'][-1]:.1f} s "
                  f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)", flush=True)
    d, s = statistics.median(times["direct"]), statistics.median(times["sweep"])
    print(f"{args.trials} trials of {args.total_steps} steps, {args.concurrency} at a time: direct {d:.1f} s, "
          f"sweep {s:.1f} s, sweep / direct = {s / d:.3f} (target ≤ 1.10 for ≈ 2-minute trials)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
