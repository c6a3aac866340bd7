"""SAC update speed against a same-FLOP MLP roofline, and the cost of the spectral regularizer.

    python -m benchmarks.update_speed [--threads 2] [--batch 256] [--hidden 256] [--repeats 7]

Times ``SAC.train_steps`` (cheetah-run dimensions: obs 17, action 6; fp32) and, in the same
process, the forward+backward of plain ``nn.Linear`` MLPs of the agent's layer shapes at the same
batch, scaled to the update's FLOP count. Prints ms/update, the ratio to that roofline, and the
ratio of spectral-regularized (actor and critic) to plain updates. Medians over interleaved
repeats, so both sides of each ratio see the same machine load.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from benchmarks.common import (
    ACT,
    OBS,
    build,
    interleaved_medians,
    sac_config,
    time_updates,
)
from sac_spectral.agents import SAC
from sac_spectral.core.nets import BatchedMLP


def mlp_flops(net: BatchedMLP, batch: int) -> tuple[int, int]:
    """Forward FLOPs of all layers, heads included, and of the first layer (2·M·B·in·out each)."""
    per_layer = [
        2 * net.members * batch * layer.in_features * layer.out_features for layer in [*net.layers, *net.heads]
    ]
    return sum(per_layer), per_layer[0]


def update_flops(agent: SAC, batch: int) -> int:
    """Matmul FLOPs of one SAC update (target critic, two actor passes, critic fwd/bwd, actor bwd)."""
    fc, fc1 = mlp_flops(agent.critic, batch)
    fa, fa1 = mlp_flops(agent.actor, batch)
    # critic: target fwd + fwd + bwd(weights, inputs but the first) ; actor step: critic fwd + input bwd
    # actor: fwd for the target's next action + fwd + bwd(weights, inputs but the first)
    return (fc + fc + 2 * fc - fc1 + fc + fc) + (fa + fa + 2 * fa - fa1)


def roofline_rate(hidden: int, batch: int, iters: int = 20) -> float:
    """FLOP/s of forward+backward through plain nn.Linear MLPs with the agent's layer shapes."""
    critic_in, actor_in = OBS + ACT, OBS
    nets = [
        nn.Sequential(nn.Linear(critic_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                      nn.Linear(hidden, 1)),
        nn.Sequential(nn.Linear(actor_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                      nn.Linear(hidden, 2 * ACT)),
    ]
    xs = [torch.randn(batch, critic_in), torch.randn(batch, actor_in)]
    flops = 0
    for net in nets:
        for m in net:
            if isinstance(m, nn.Linear):
                flops += (3 * 2 * batch * m.in_features * m.out_features
                          - (2 * batch * m.in_features * m.out_features if m is net[0] else 0))
    for _ in range(3):
        for net, x in zip(nets, xs):
            net(x).sum().backward()
    t = time.perf_counter()
    for _ in range(iters):
        for net, x in zip(nets, xs):
            net.zero_grad(set_to_none=True)
            net(x).sum().backward()
    return flops * iters / (time.perf_counter() - t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--updates", type=int, default=64, help="updates per timing")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    plain, buf = build(sac_config(args.hidden))
    spectral, _ = build(sac_config(args.hidden, spectral=True))
    flops = update_flops(plain, args.batch)
    for agent in (plain, spectral):
        time_updates(agent, buf, args.batch, 16)
    t = interleaved_medians(
        {
            "plain": lambda: time_updates(plain, buf, args.batch, args.updates),
            "spectral": lambda: time_updates(spectral, buf, args.batch, args.updates),
            "roofline": lambda: flops / roofline_rate(args.hidden, args.batch),
        },
        args.repeats,
    )
    mp, ms, mr = (t[k] * 1e3 for k in ("plain", "spectral", "roofline"))
    print(f"threads={args.threads} batch={args.batch} hidden=2x{args.hidden} fp32, {flops / 1e9:.3f} GFLOP/update")
    print(f"  roofline (same-FLOP nn.Linear MLP fwd+bwd): {mr:7.3f} ms  ({flops / mr / 1e6:.0f} GFLOP/s)")
    print(f"  SAC update, plain:                          {mp:7.3f} ms  ratio to roofline {mp / mr:.3f}")
    print(f"  SAC update, spectral (actor + critic):      {ms:7.3f} ms  ratio to roofline {ms / mr:.3f}")
    print(f"  spectral on / off:                          {ms / mp:.3f}")


if __name__ == "__main__":
    main()
