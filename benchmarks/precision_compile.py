"""Speed of the SAC update options against the fp32 eager update, in one process.

    python -m benchmarks.precision_compile [--threads 2] [--device cpu] [--repeats 7]

Variants: fp32 eager, ``precision=bf16`` (bf16 weight copies re-cast once per optimizer step),
torch.compile, bf16 + compile (CUDA graphs on GPU), and ``bf16-autocast``: the fp32 agent with its
losses run under ``torch.autocast`` (the alternative to weight copies: it casts each
weight at every use). bf16 pays off on CPUs with AVX512-BF16/AMX and on GPUs; compile warm-up time
is reported separately. Prints ms/update and the speed-up over fp32 eager (medians of interleaved
repeats).
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import build, interleaved_medians, sac_config, time_updates
from sac_spectral.agents import SAC

VARIANTS = {
    "fp32": {},
    "bf16": {"precision": "bf16"},
    "fp32+compile": {"compile": True},
    "bf16+compile": {"precision": "bf16", "compile": True},
    "bf16-autocast": {},
}


def autocast_losses(agent: SAC) -> None:
    """Run ``agent``'s (fp32) loss functions under bf16 autocast."""
    autocast = torch.autocast(agent.log_alpha.device.type, torch.bfloat16)
    agent.critic_step, agent.actor_step = autocast(agent.critic_step), autocast(agent.actor_step)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--updates", type=int, default=32, help="updates per timing (one env step at replay ratio 32)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    agents, warmup = {}, {}
    for name in args.variants:
        agent, buf = build(sac_config(**VARIANTS[name]), device=args.device)
        if name == "bf16-autocast":
            autocast_losses(agent)
        t = time.perf_counter()
        time_updates(agent, buf, args.batch, args.updates, calls=2)
        warmup[name] = time.perf_counter() - t
        agents[name] = agent
    t = interleaved_medians(
        {name: (lambda a=a: time_updates(a, buf, args.batch, args.updates)) for name, a in agents.items()}, args.repeats
    )
    base = t.get("fp32", next(iter(t.values())))
    print(f"device={args.device} threads={args.threads} batch={args.batch} 2x256, {args.updates} updates per call")
    for name, sec in t.items():
        print(f"  {name:<14} {sec * 1e3:8.3f} ms/update   speed-up vs fp32 {base / sec:5.2f}x   warm-up "
              f"{warmup[name]:6.1f} s")


if __name__ == "__main__":
    main()
