"""What compiling the update costs and what it gains per update: the numbers behind ``compile: auto``.

    python -m benchmarks.compile_cost [--threads 1] [--repeats 5] [--seeds 1]

In this process: the time of the first compiled call of the default agent (spectral-regularized
SAC, 2×256 MLPs, cheetah-run shapes, one update per call as at replay ratio 1) — the compile, cold
or from inductor's on-disk cache depending on ``$TORCHINDUCTOR_CACHE_DIR`` — and then the eager
and the compiled update's time (medians of interleaved repeats). The updates after which the
compile has paid for itself are the compile's time over the per-update gain. Run it twice with a
fresh ``TORCHINDUCTOR_CACHE_DIR`` for the cold and the cached figure; with a fresh
``TORCH_EXTENSIONS_DIR`` the first process also builds the C++ kernels (it says how long).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import build, interleaved_medians, sac_config, time_updates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--updates", type=int, default=50, help="updates per timing (one call each)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    eager, buf = build(sac_config(spectral=True, compile=False), seeds=args.seeds)
    start, cpu = time.perf_counter(), cpu_s()
    compiled, _ = build(sac_config(spectral=True, compile=True), seeds=args.seeds)
    compiled.train_steps(buf, 1, args.batch)
    first, first_cpu = time.perf_counter() - start, cpu_s() - cpu
    time_updates(eager, buf, args.batch, 1, calls=5)
    time_updates(compiled, buf, args.batch, 1, calls=5)
    clocks = {"wall": time.perf_counter, "cpu": cpu_s}
    for clock, now in clocks.items():
        t = interleaved_medians({name: (lambda a=a, now=now: timed(now, a, buf, args.batch, args.updates))
                                 for name, a in (("eager", eager), ("compiled", compiled))}, args.repeats)
        cost = first if clock == "wall" else first_cpu
        gain = t["eager"] - t["compiled"]
        print(f"{clock}: threads={args.threads} seeds={args.seeds} batch={args.batch}: building the agent and its "
              f"first compiled call {cost:.1f} s; eager {t['eager'] * 1e3:.2f} ms/update, compiled "
              f"{t['compiled'] * 1e3:.2f} ms/update, gain {gain * 1e3:.2f} ms/update; the compile pays after "
              f"{cost / max(gain, 1e-9):.0f} updates")


def cpu_s() -> float:
    """CPU seconds of this process and its finished children (the C++ compiler's) so far."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def timed(clock: Callable[[], float], agent: Any, buf: Any, batch: int, count: int) -> float:
    """Seconds per update by ``clock`` over ``count`` calls of one update each."""
    start = clock()
    for _ in range(count):
        agent.train_steps(buf, 1, batch)
    return (clock() - start) / count


if __name__ == "__main__":
    main()
