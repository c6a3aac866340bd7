"""Where the time of one SAC update goes, by operator: torch.profiler over ``SAC.train_steps``.

    python -m benchmarks.update_profile [--seeds 1] [--threads 1] [--updates 200] [--top 20]

Plain SAC (no regularizers), cheetah-run shapes (obs 17, action 6), 2×256 networks, batch 256,
fp32. Prints the operators with the most self CPU time per update (their share of the update and
their calls per update), then the totals: operator calls per update and how much of the update
the matmuls (``addmm``, ``bmm``, ``baddbmm``, ``mm``) take. The rest is elementwise work,
optimizer steps and dispatch, what a compiler fuses.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import build, sac_config

MATMULS = ("aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mm", "aten::matmul", "aten::linear")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--updates", type=int, default=200)
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    agent, buf = build(sac_config(), seeds=args.seeds)
    agent.train_steps(buf, 50, 256)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        agent.train_steps(buf, args.updates, 256)
    events = [e for e in prof.key_averages() if e.key != "ProfilerStep*"]
    total_us = sum(e.self_cpu_time_total for e in events)
    n = args.updates
    print(f"{args.seeds} seed(s), {args.threads} thread(s): {total_us / n / 1e3:.2f} ms of operator time per update")
    print(f"{'operator':<44}{'self ms/update':>15}{'share':>8}{'calls/update':>14}")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(f"{e.key[:43]:<44}{e.self_cpu_time_total / n / 1e3:>15.3f}{e.self_cpu_time_total / total_us:>8.1%}"
              f"{e.count / n:>14.1f}")
    matmul_us = sum(e.self_cpu_time_total for e in events if e.key in MATMULS)
    calls = sum(e.count for e in events)
    print(f"operator calls per update: {calls / n:.0f}; matmuls {matmul_us / total_us:.1%} of the operator time")


if __name__ == "__main__":
    main()
