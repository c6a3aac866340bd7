"""Cost of each plasticity metric (sac_spectral.diagnostics.plasticity) against one default SAC update.

    python -m benchmarks.plasticity_metrics_cost [--threads 1] [--probe 256] [--repeats 7]

Default SAC (``TrainConfig()``: 2×256 actor and twin critics, batch 256, fp32) with cheetah-run
dimensions (obs 17, action 6), one seed. For each metric, actor and critic together: µs per call,
its share of one update, and its share of training when computed once per 1000 updates
(``log_every`` at replay ratio 1, or ``diagnostics.every``): t / (1000 · t_update + t). Metrics
of hidden features need the features of a probe batch first (their own line: one forward of
actor and critics); ``effective_lr`` and ``churn`` include what they take before the update (a
copy of the parameters; the outputs on the reference batch). Medians over interleaved repeats.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from benchmarks.common import build, interleaved_medians, time_updates
from sac_spectral.agents.probes import hidden_features, probe_batch
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.diagnostics import (
    ParamSnapshot,
    UpdateProbe,
    active_fraction,
    churn,
    effective_lr,
    feature_norm,
    feature_spectrum,
    feature_srank,
    grad_norm,
    reference_outputs,
    srank,
    weight_magnitude,
)

EVERY = 1000


def per_call(fn: Callable[[], object], inner: int) -> Callable[[], float]:
    """Seconds per call of ``fn``, averaged over ``inner`` calls."""
    def timed() -> float:
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - t) / inner
    return timed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--probe", type=int, default=256, help="examples in the probe / reference batch")
    p.add_argument("--updates", type=int, default=50, help="updates per timing of the update")
    p.add_argument("--inner", type=int, default=20, help="calls per timing of a metric")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = TrainConfig()
    agent, buf = build(cfg)
    agent.train_steps(buf, 10, cfg.batch_size)  # warm up; leaves the last update's .grad set
    batch, _ = probe_batch(agent, buf, args.probe, [0], tick=0)
    nets = {"actor": agent.actor, "critic": agent.critic}
    ref = {"actor": batch["obs"], "critic": agent.critic_inputs(batch["obs"], batch["action"])}
    forwards = {"actor": lambda x: torch.tanh(agent.actor(x)[0]), "critic": agent.critic}
    feats = {k: v[-1] for k, v in hidden_features(agent, batch).items()}
    sigmas = {k: feature_spectrum(h)[0] for k, h in feats.items()}
    inits = {k: ParamSnapshot(n) for k, n in nets.items()}
    probes = {k: UpdateProbe(n, k, forwards[k]) for k, n in nets.items()}

    def both(fn: Callable[[str], object]) -> Callable[[], None]:
        return lambda: [fn(k) for k in nets]

    def probe_cycle() -> None:
        for k, probe in probes.items():
            probe.before(ref[k])
        for probe in probes.values():
            probe.after()

    metrics: dict[str, tuple[str, Callable[[], None]]] = {
        "hidden features of the probe batch (forward)": ("diagnostics", lambda: hidden_features(agent, batch)),
        "features/stable_rank (SVD + srank)": ("diagnostics", both(lambda k: feature_srank(feats[k]))),
        "features/stable_rank from the diagnostics' σ": ("diagnostics", both(lambda k: srank(sigmas[k]))),
        "features/norm": ("diagnostics", both(lambda k: feature_norm(feats[k]))),
        "active/fraction": ("diagnostics", both(lambda k: active_fraction(feats[k]))),
        "weights/magnitude": ("log", both(lambda k: weight_magnitude(nets[k]))),
        "weights/distance_from_init": ("log", both(lambda k: inits[k].distance(nets[k]))),
        "grads/norm": ("log", both(lambda k: grad_norm(nets[k]))),
        "weights/effective_lr (copy before + ratio)": ("log",
                                                       both(lambda k: effective_lr(ParamSnapshot(nets[k]), nets[k]))),
        "churn (outputs before + after)": ("log", both(lambda k: churn(forwards[k], ref[k], reference_outputs(
            forwards[k], ref[k], nets[k].members), members=nets[k].members))),
        "UpdateProbe before + after (the three above)": ("log", probe_cycle),
    }
    fns = {"update": lambda: time_updates(agent, buf, cfg.batch_size, args.updates)}
    fns.update({name: per_call(fn, args.inner) for name, (_, fn) in metrics.items()})
    for fn in fns.values():
        fn()
    t = interleaved_medians(fns, args.repeats)
    upd = t["update"]
    print(f"threads={args.threads} default SAC (2x256, batch {cfg.batch_size}, twin critics, fp32), "
          f"probe/reference batch {args.probe}; medians of {args.repeats} interleaved repeats")
    print(f"  one SAC update: {upd * 1e6:9.0f} us")
    print(f"  {'metric (actor + critic)':48s} {'us/call':>9s} {'% update':>9s} {'% of run at 1/' + str(EVERY):>16s}  "
          "schedule")
    for name, (where, _) in metrics.items():
        c = t[name]
        share = c / (EVERY * upd + c)
        print(f"  {name:48s} {c * 1e6:9.0f} {100 * c / upd:8.2f}% {100 * share:15.4f}%  {where}")


if __name__ == "__main__":
    main()
