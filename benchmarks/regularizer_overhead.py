"""Cost of each regularizer on a SAC update: time with the method (on actor and critic) / without.

    python benchmarks/regularizer_overhead.py [--threads 1] [--batch 256] [--hidden 256] [--repeats 7] [--compile]

Every method runs on a copy of the plain agent (cheetah-run dimensions, 2×256 MLPs, fp32, two
critics); the ratio is the median over interleaved repeats of ``SAC.train_steps`` time per update
with the method over the plain agent's, measured in one process so both sides see the same load.
``nap`` needs a normalization layer before every nonlinearity and is timed against the plain
agent with ``layer_norm: true``; ``plasticity_injection`` injects at the first warm-up update, so
its row is the cost of the injected network (three heads) per update. Interventions that act
every ``every`` updates (``redo``, ``reset``, ``shrink_perturb``) also get the cost of one firing on both networks in
units of a plain update; their amortized ratio at interval N is ``ratio + firing/N``. ``added ms`` is the median of the
paired differences per update (a ratio also moves when the plain update gets faster). Target: ``spectral`` (max mode)
≤ 1.05. ``--compile`` times both sides with ``compile: true`` (the penalties' gradients formed inside the
compiled program; the probe rows are eager-only and skipped); compile time is not counted.

Two probe rows split that cost: ``spectral (max), forward only`` computes the penalty (power step
included) without letting autograd see it, and ``autograd floor`` adds a penalty of value 0 whose
backward returns zero gradients for every parameter: the least any penalty that autograd
differentiates pays (one more node per loss, a full-size gradient per parameter and its sum with
the loss's gradient), however cheap its own formula.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.update_speed import build, time_updates  # noqa: E402
from sac_spectral.agents import SAC, SACConfig  # noqa: E402
from sac_spectral.regularizers import Regularizer  # noqa: E402

#: name → (regularizer entry, optimizer options); interventions fire only when timed separately
METHODS: dict[str, tuple[dict | None, dict]] = {
    "spectral (max)": ({"name": "spectral", "coef": 1e-4}, {}),
    "spectral (all)": ({"name": "spectral", "coef": 1e-4, "mode": "all"}, {}),
    "l2": ({"name": "l2", "coef": 1e-4}, {}),
    "l2_init": ({"name": "l2_init", "coef": 1e-4}, {}),
    "wasserstein_init": ({"name": "wasserstein_init", "coef": 1e-4}, {}),
    "parseval": ({"name": "parseval", "coef": 1e-3}, {}),
    "spectral_norm": ({"name": "spectral_norm"}, {}),
    "shrink_perturb (every 1)": ({"name": "shrink_perturb", "every": 1}, {}),
    "redo": ({"name": "redo", "every": 10**9}, {}),
    "reset": ({"name": "reset", "every": 10**9}, {}),
    "weight_decay (AdamW)": (None, {"weight_decay": 1e-4}),
    "layer_norm": (None, {"layer_norm": True}),
    "nap (vs layer_norm)": ({"name": "nap"}, {"layer_norm": True}),
    "cbp": ({"name": "cbp"}, {}),
    "plasticity_injection (after)": ({"name": "plasticity_injection", "at_step": 1}, {}),
}
#: rows timed against the plain agent with these options (the method needs them), not the plain agent
BASELINES = {"nap (vs layer_norm)": {"layer_norm": True}}
FIRING = {"redo": 1000, "reset": 1000}


class _ZeroGradients(torch.autograd.Function):
    """Value 0; backward returns a new zero gradient for every parameter."""

    @staticmethod
    def forward(ctx: Any, *params: Tensor) -> Tensor:
        ctx.save_for_backward(*params)
        return params[0].new_zeros(())

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, ...]:
        return tuple(torch.zeros_like(p) for p in ctx.saved_tensors)


class _AutogradFloor(Regularizer):
    name = "autograd_floor"

    def penalty(self) -> Tensor:
        return _ZeroGradients.apply(*self.module.parameters())


class _ForwardOnly(Regularizer):
    """Another regularizer's penalty, computed with autograd off (no backward, no gradient)."""

    def __init__(self, inner: Regularizer) -> None:
        super().__init__(inner.module)
        self.inner = inner

    def penalty(self) -> Tensor:
        with torch.no_grad():
            return self.inner.penalty()


def probe_agent(hidden: int, label: str) -> SAC:
    """A plain agent with a probe regularizer on actor and critic (see the module docstring)."""
    if label == "autograd floor":
        agent, _ = build(config(hidden, None, {}))
        for t in agent.trained.values():
            t.regularizers = [_AutogradFloor(t.module)]
    else:
        agent, _ = build(config(hidden, METHODS["spectral (max)"][0], {}))
        for t in agent.trained.values():
            t.regularizers = [_ForwardOnly(r) for r in t.regularizers]
    return agent


PROBES = ("spectral (max), forward only", "autograd floor")


def config(hidden: int, entry: dict | None, opt: dict, compile_: bool = False) -> SACConfig:
    cfg = SACConfig(compile=compile_)
    for net in (cfg.actor, cfg.critic):
        net.hidden = [hidden, hidden]
        net.regularizers = [entry] if entry else []
        for key, value in opt.items():
            setattr(net, key, value)
    return cfg


def firing_time(agent: SAC, repeats: int) -> float:
    """Median seconds of one forced firing of every intervention of actor and critic."""
    regs = [r for t in agent.trained.values() for r in t.regularizers]
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for reg in regs:
            reg.after_step(reg.every)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--updates", type=int, default=48, help="updates per timing")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--only", nargs="*", default=None, help="subset of methods (names as printed)")
    p.add_argument("--compile", action="store_true", help="both sides with compile=true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    plain, buf = build(config(args.hidden, None, {}, args.compile))
    time_updates(plain, buf, args.batch, 8)
    print(f"threads={args.threads} batch={args.batch} hidden=2x{args.hidden} fp32 compile={args.compile}; method on "
          f"actor and critic; medians of {args.repeats} interleaved repeats of {args.updates} updates")
    print(f"{'method':28s} {'with/without':>12s} {'added ms':>9s}  {'one firing (plain updates)':>26s}")
    for label in [*METHODS, *(() if args.compile else PROBES)]:
        if args.only and label not in args.only:
            continue
        entry, opt = METHODS.get(label, (None, {}))
        agent = probe_agent(args.hidden,
                            label) if label in PROBES else build(config(args.hidden, entry, opt, args.compile))[0]
        time_updates(agent, buf, args.batch, 8)
        baseline = plain
        if label in BASELINES:
            baseline = build(config(args.hidden, None, BASELINES[label], args.compile))[0]
            time_updates(baseline, buf, args.batch, 8)
        base, with_ = [], []
        for _ in range(args.repeats):
            base.append(time_updates(baseline, buf, args.batch, args.updates))
            with_.append(time_updates(agent, buf, args.batch, args.updates))
        ratio = statistics.median(w / b for w, b in zip(with_, base))
        added_ms = statistics.median(w - b for w, b in zip(with_, base)) * 1e3
        note = ""
        if entry and entry["name"] in FIRING:
            every = FIRING[entry["name"]]
            fire = firing_time(agent, args.repeats) / statistics.median(base)
            note = f"{fire:10.1f}   (amortized at every={every}: {ratio + fire / every:.3f})"
        print(f"{label:28s} {ratio:12.3f} {added_ms:9.3f}  {note}", flush=True)


if __name__ == "__main__":
    main()
