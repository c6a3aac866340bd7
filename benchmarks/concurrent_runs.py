"""Updates/s of training runs side by side: one run alone, then ``--together`` runs started at once.

    python -m benchmarks.concurrent_runs [--together 2] [--updates 3000] [--repeats 2] [--before] [key=value ...]

Each run is ``python -m sac_spectral.train`` on dmc:cheetah-run with ``--random-steps`` warm-up
steps, then one update per env step, no evaluation, checkpoints or diagnostics, plus the given
``key=value`` overrides (default: none, i.e. ``threads=0``, as a user starts it). The processes
get this environment without ``OMP_*``, ``GOMP_*``, ``MKL_*`` thread settings unless
``--keep-env``. A run's updates/s is read from its TensorBoard ``perf/updates_per_s`` intervals
after the warm-up; for runs started together only the intervals in which all of them were
updating count. Prints each run's rate and its ratio to the rate of the run alone (target ≥ 0.40
for two runs on two cores), and with ``--before`` also the rate of a run alone as the runner
behaved before (all cores, libgomp's default spin-wait: ``GOMP_SPINCOUNT=300000``; target: the
default loses ≤ 5 %) and, with ``--before-together``, two such runs started together
(``--before-updates`` each: they crawl). The load average is printed before and after: other
processes on the machine change the result, so measure when it is otherwise idle.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CLEARED = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES")
def command(run_dir: Path, updates: int, args: argparse.Namespace, overrides: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "sac_spectral.train", "env=dmc:cheetah-run", f"total_steps={args.random_steps + updates}",
        f"random_steps={args.random_steps}", "eval_every=0", "eval_episodes=1", f"log_every={args.log_every}",
        "checkpoint_every=0", "diagnostics.every=0", "progress=false", f"run_dir={run_dir}", *overrides,
    ]


def intervals(run_dir: Path, random_steps: int, log_every: int) -> list[tuple[float, float, float]]:
    """``(start wall time, end wall time, updates)`` of each logged interval after the warm-up."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("perf/updates_per_s")
    out = []
    for prev, ev in zip(events, events[1:]):
        if prev.step >= random_steps + log_every:  # the interval (prev, ev] holds updates only
            out.append((prev.wall_time, ev.wall_time, (ev.wall_time - prev.wall_time) * ev.value))
    return out


def rate(spans: list[tuple[float, float, float]], lo: float = float("-inf"), hi: float = float("inf")) -> float:
    """Updates per second over the intervals inside ``[lo, hi]``."""
    inside = [(a, b, n) for a, b, n in spans if a >= lo and b <= hi]
    if not inside:
        raise RuntimeError("no logged interval inside the window; use more --updates")
    return sum(n for _, _, n in inside) / sum(b - a for a, b, _ in inside)


def threads_used(stderr: str) -> str:
    """The thread count from the runner's ``config: … | cpu, N thread(s)`` line ("?" if absent)."""
    found = re.search(r"^config: .*\| \w+, (\d+) threads?", stderr, re.MULTILINE)
    return found.group(1) if found else "?"


def launch(count: int, args: argparse.Namespace, root: Path, tag: str, before: bool = False) -> list[tuple[float, str]]:
    """Start ``count`` runs at once; each one's updates/s over the time all of them were updating,
    and the thread count it used."""
    env = dict(os.environ) if args.keep_env else {k: v for k, v in os.environ.items() if k not in CLEARED}
    overrides, updates = list(args.overrides), args.updates
    if before:
        env["GOMP_SPINCOUNT"] = "300000"
        overrides.append(f"threads={len(os.sched_getaffinity(0))}")
        updates = args.before_updates if count > 1 else updates
    dirs = [root / f"{tag}_{i}" for i in range(count)]
    procs = [
        subprocess.Popen(command(d, updates, args, overrides), env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for d in dirs
    ]
    used = []
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a run failed (exit {p.returncode}):\n{err}")
        used.append(threads_used(err))
    spans = [intervals(d, args.random_steps, args.log_every) for d in dirs]
    lo, hi = max(s[0][0] for s in spans), min(s[-1][1] for s in spans)
    return [(rate(s, lo, hi), n) for s, n in zip(spans, used)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--together", type=int, default=2, help="runs started at once")
    p.add_argument("--updates", type=int, default=3000, help="updates per run")
    p.add_argument("--random-steps", type=int, default=500)
    p.add_argument("--log-every", type=int, default=250, help="env steps per logged rate interval")
    p.add_argument("--repeats", type=int, default=2, help="alternated rounds; medians")
    p.add_argument("--before", action="store_true", help="also time a run alone as the runner behaved before")
    p.add_argument("--before-together", action="store_true", help="also start --together such runs at once")
    p.add_argument("--before-updates", type=int, default=750, help="updates of each run in --before-together")
    p.add_argument("--keep-env", action="store_true", help="pass OMP_*/GOMP_*/MKL_* variables on to the runs")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="train overrides for every run, e.g. threads=1")
    args = p.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"cores: {len(os.sched_getaffinity(0))}")
    print(f"runs: cheetah-run, {args.random_steps} random steps + {args.updates} updates, overrides: "
          f"{args.overrides or 'none'}")
    rounds: dict[str, list[list[tuple[float, str]]]] = {"alone": [], "together": []}
    if args.before:
        rounds["alone, before"] = []
    if args.before_together:
        rounds["together, before"] = []
    with tempfile.TemporaryDirectory(prefix="concurrent_runs_") as tmp:
        root = Path(tmp)
        for r in range(args.repeats):
            for name in rounds:
                count = args.together if name.startswith("together") else 1
                rounds[name].append(launch(count, args, root, f"{name.replace(', ', '_')}{r}", "before" in name))
            print(f"  round {r} (updates/s, threads): "
                  + "; ".join(f"{k} " + ", ".join(f"{x:.1f} ({n})" for x, n in v[-1]) for k, v in rounds.items()),
                  flush=True)
    med = {k: [statistics.median(rnd[i][0] for rnd in v) for i in range(len(v[0]))] for k, v in rounds.items()}
    base = med["alone"][0]
    print(f"alone: {base:.1f} updates/s (median of {args.repeats})")
    for i, x in enumerate(med["together"]):
        print(f"together, run {i}: {x:.1f} updates/s = {x / base:.2f} of alone")
    print(f"aggregate together / alone: {sum(med['together']) / base:.2f}")
    if "alone, before" in med:
        old = med["alone, before"][0]
        print(f"alone as before (all cores, GOMP_SPINCOUNT=300000): {old:.1f} updates/s; "
              f"now / before: {base / old:.3f}")
    if "together, before" in med:
        print("together as before: "
              + ", ".join(f"{x:.1f} updates/s = {x / base:.2f} of alone" for x in med["together, before"]))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
