"""Throughput of a run whose machine becomes busy half-way: a CPU hog (one busy process) starts when
the run reaches half of its steps, and the run's updates per second before and after are compared.

    python benchmarks/busy_midrun.py [--env dmc:cheetah-run] [--steps 8000] [--threads 0,2]

Each thread setting is one ``python -m sac_spectral.train`` run (the default agent, no
evaluations or diagnostics). ``threads=0`` re-chooses its thread count every 10 s from the cores
other processes leave idle; ``threads=2`` keeps two. Before: the median ``perf/updates_per_s`` of
the logs between the first updates and the hog's start; after: the median of the logs from 15 s
after the start (one re-choice window and a margin) to the end. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

SETTLE_S = 15.0


def _scalars(run_dir: Path, tag: str) -> list[tuple[float, int, float]]:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.wall_time, e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def one_run(args: argparse.Namespace, threads: int, where: Path) -> dict[str, float]:
    run_dir = where / f"threads{threads}"
    cmd = [sys.executable, "-m", "sac_spectral.train", f"env={args.env}", f"total_steps={args.steps}",
           f"random_steps={args.random_steps}", "eval_every=0", "eval_episodes=1", f"log_every={args.log_every}",
           "checkpoint_every=0", "diagnostics.every=0", "progress=false", f"threads={threads}", f"run_dir={run_dir}"]
    run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    hog, hog_start = None, None
    try:
        while run.poll() is None:
            time.sleep(1.0)
            if hog is None and run_dir.is_dir():
                steps = [s for _, s, _ in _scalars(run_dir, "perf/updates_per_s")]
                if steps and steps[-1] >= args.steps // 2:
                    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    hog_start = time.time()
        if run.returncode != 0:
            raise SystemExit(f"the run failed: {run.stderr.read()[-2000:] if run.stderr else ''}")
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    if hog_start is None:
        raise SystemExit("the run ended before the hog started; give more --steps")
    rates = _scalars(run_dir, "perf/updates_per_s")
    first_updates = args.random_steps + 2 * args.log_every
    before = [v for t, s, v in rates if first_updates <= s and t <= hog_start]
    after = [v for t, s, v in rates if t >= hog_start + SETTLE_S]
    used = [v for t, _, v in _scalars(run_dir, "perf/threads") if t >= hog_start + SETTLE_S]
    if not before or not after:
        raise SystemExit(f"too few logs before ({len(before)}) or after ({len(after)}) the hog; give more --steps")
    return {"before": statistics.median(before), "after": statistics.median(after),
            "threads_after": statistics.median(used) if used else float("nan")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="dmc:cheetah-run")
    p.add_argument("--steps", type=int, default=8000)
    p.add_argument("--random-steps", type=int, default=1000)
    p.add_argument("--log-every", type=int, default=250)
    p.add_argument("--threads", default="0,2", help="comma-separated thread settings to run")
    args = p.parse_args()
    print(f"{args.env}: {args.steps} steps ({args.random_steps} random), a one-core hog from step {args.steps // 2}")
    kept = {}
    with tempfile.TemporaryDirectory() as where:
        for threads in (int(t) for t in args.threads.split(",")):
            r = one_run(args, threads, Path(where))
            kept[threads] = r["after"] / r["before"]
            print(f"threads={threads}: {r['before']:.1f} updates/s idle, {r['after']:.1f} busy "
                  f"({r['threads_after']:.0f} threads): keeps {kept[threads]:.0%}", flush=True)
    print("kept under load: " + " | ".join(f"threads={t} {k:.2f}" for t, k in kept.items()))


if __name__ == "__main__":
    main()
