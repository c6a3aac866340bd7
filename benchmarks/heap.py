"""The heap setting of a run (:mod:`sac_spectral.core.heap`) against glibc's
default, per update, eager and compiled, on one thread.

    pip install -e ".[bench]"
    python benchmarks/heap.py [--seeds 1,10] [--modes eager,compiled] [--rounds 3]

Plain SAC with cheetah-run shapes (2×256, batch 256, N seeds as members) in a fresh process per
measurement: ``configured`` is the package as it runs, ``glibc default`` the same with
``GLIBC_TUNABLES`` set empty (so the package leaves malloc alone). The two alternate for
``--rounds`` rounds. Prints the median ms per update of each, with the minor page faults per
update (what the setting saves: pages the kernel maps and zeroes again every update), and
default / configured, with the CPU flags and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_flags  # noqa: E402

SETTINGS = {"glibc default": {"GLIBC_TUNABLES": ""}, "configured": {}}


def worker(seeds: int, mode: str, calls: int) -> None:
    """Time ``calls`` calls of 8 updates after two warm-up calls; print ms and faults per update."""
    import torch

    from benchmarks.common import build, sac_config
    from sac_spectral.core.heap import configure_heap

    torch.set_num_threads(1)
    configured = configure_heap()  # as a run sets it when it starts
    agent, buf = build(sac_config(compile=mode == "compiled"), seeds=seeds)
    for _ in range(2):
        agent.train_steps(buf, 8, 256)
    times, faults = [], resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        start = time.perf_counter()
        agent.train_steps(buf, 8, 256)
        times.append((time.perf_counter() - start) / 8)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / (8 * calls)
    print(json.dumps({"ms": 1e3 * statistics.median(times), "faults": faults, "configured": configured}))


def measure(seeds: int, mode: str, setting: str, calls: int) -> dict[str, float]:
    env = {**os.environ, **SETTINGS[setting]}
    out = subprocess.run([sys.executable, __file__, "--worker", str(seeds), mode, str(calls)], env=env,
                         capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["configured"] == (setting == "configured"), result
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1,10", help="comma-separated seed counts")
    p.add_argument("--modes", default="eager,compiled", help="eager, compiled or both")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=7, help="timed calls of 8 updates per process")
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(int(args.worker[0]), args.worker[1], int(args.worker[2]))
        return
    load = os.getloadavg()[0]
    print(f"cpu flags: {cpu_flags()}; 1 thread per process; load average {load:.2f}")
    print(f"{'seeds':>5} {'mode':<9}{'glibc default':>22}{'configured':>22}{'default / configured':>22}")
    for seeds in (int(s) for s in args.seeds.split(",")):
        for mode in args.modes.split(","):
            runs: dict[str, list[dict[str, float]]] = {s: [] for s in SETTINGS}
            for _ in range(args.rounds):
                for setting in SETTINGS:
                    runs[setting].append(measure(seeds, mode, setting, args.calls))
            ms = {s: statistics.median(r["ms"] for r in v) for s, v in runs.items()}
            faults = {s: statistics.median(r["faults"] for r in v) for s, v in runs.items()}
            cells = [f"{ms[s]:7.2f} ms {faults[s]:6.0f} flt" for s in SETTINGS]
            print(f"{seeds:>5} {mode:<9}{cells[0]:>22}{cells[1]:>22}{ms['glibc default'] / ms['configured']:>22.2f}",
                  flush=True)
    print(f"load average {load:.2f} → {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
