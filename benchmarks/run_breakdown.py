"""Where the wall time of one whole ``python -m sac_spectral.train`` run goes.

    python -m benchmarks.run_breakdown [train overrides …]
    python -m benchmarks.run_breakdown total_steps=4000 random_steps=1000 threads=2 progress=false \\
        'critic.regularizers=[]' 'actor.regularizers=[]' diagnostics.every=0 eval_episodes=1

Runs the training job in this process, exactly as the command line would (the overrides are
``sac_spectral.train``'s; a temporary run directory unless ``run_dir`` is given), with a wall-clock
timer around each part of the loop: start-up (imports of the package, then building envs, agent
and buffer, which imports ``torch._dynamo`` through the first ``torch.optim`` optimizer), the
gradient updates, ``train_steps``' own work around them (replay sampling, the batch's layout,
noise draws), acting, env steps with their buffer writes, logging and checkpoints, diagnostics,
evaluations. Prints seconds, calls, ms per call and the share of the process's wall time; the
``rest`` row is what no timer covers (the loop itself, episode bookkeeping, exit). The timers
cost about a microsecond per call. This is the profile behind ``benchmarks.vs_sb3``'s
whole-process ratio: at replay ratio 1 every row but the first is paid once per env step.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import collections  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import sac_spectral  # noqa: E402,F401  (before torch: OpenMP settings, as the CLI)
from sac_spectral.agents import SAC  # noqa: E402
from sac_spectral.apps.rl import train  # noqa: E402
from sac_spectral.apps.rl.evaluation import Evaluation  # noqa: E402
from sac_spectral.envs import EnvPool  # noqa: E402
from sac_spectral.runs.run import Run  # noqa: E402

_IMPORTS = time.perf_counter() - _T0

#: row → (class, method) of a timer; each row gets the time of its calls minus that of the timed
#: calls inside them (an evaluation inside ``Run.after`` counts as an evaluation)
TIMED: dict[str, tuple[type, str]] = {
    "start-up: envs, agent, buffer": (train.Trainer, "__init__"),
    "updates (SAC.update)": (SAC, "update"),
    "train_steps around the updates": (SAC, "train_steps"),
    "acting (Trainer._act)": (train.Trainer, "_act"),
    "env steps (EnvPool.step)": (EnvPool, "step"),
    "diagnostics": (train.Trainer, "diagnose"),
    "evaluations": (Evaluation, "returns"),
    "logging, checkpoints (periodic)": (Run, "after"),
}


class Timers:
    """Self time and calls per row; ``wrap`` puts a timer around a function."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()
        self._open: list[str] = []

    def wrap(self, fn: Callable[..., Any], row: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self._open.append(row)
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t
                self._open.pop()
                self.seconds[row] += elapsed
                self.calls[row] += 1
                if self._open:
                    self.seconds[self._open[-1]] -= elapsed

        return wrapper


def main(argv: list[str]) -> int:
    timers = Timers()
    for row, (cls, name) in TIMED.items():
        setattr(cls, name, timers.wrap(getattr(cls, name), row))
    with tempfile.TemporaryDirectory() as tmp:
        if not any(a.startswith("run_dir=") for a in argv):
            argv = [*argv, f"run_dir={tmp}/run"]
        code = train.main(argv)
        total = time.perf_counter() - _T0
    if code:
        return code
    rows = [("imports (package, torch)", _IMPORTS, 1)] + [(r, timers.seconds[r], timers.calls[r]) for r in TIMED]
    rows.append(("rest", total - sum(s for _, s, _ in rows), 1))
    print(f"\nwhole process {total:.2f} s (wall)")
    print(f"{'part':34s} {'s':>8s} {'calls':>7s} {'ms/call':>9s} {'share':>7s}")
    for row, s, n in rows:
        print(f"{row:34s} {s:8.2f} {n:7d} {s / max(n, 1) * 1e3:9.3f} {s / total:7.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
