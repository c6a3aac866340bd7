"""SAC update speed against a same-FLOP MLP roofline, and the cost of the spectral regularizer.

    python benchmarks/update_speed.py [--threads 2] [--batch 256] [--hidden 256] [--repeats 7]

Times ``SAC.train_steps`` (cheetah-run dimensions: obs 17, action 6; fp32) and, in the same
process, the forward+backward of plain ``nn.Linear`` MLPs of the agent's layer shapes at the same
batch, scaled to the update's FLOP count. Prints ms/update, the ratio to that roofline, and the
ratio of spectral-regularized (actor and critic) to plain updates. Medians over interleaved
repeats, so both sides of each ratio see the same machine load.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from agents import SAC, ReplayBuffer, SACConfig
from sac_spectral.nets import BatchedMLP
from sac_spectral.seeding import SeedStreams

OBS, ACT = 17, 6


def mlp_flops(net: BatchedMLP, batch: int) -> tuple[int, int]:
    """Forward FLOPs of all layers and of the first layer (2·M·B·in·out each)."""
    per_layer = [2 * net.members * batch * layer.in_features * layer.out_features for layer in net.layers]
    return sum(per_layer), per_layer[0]


def update_flops(agent: SAC, batch: int) -> int:
    """Matmul FLOPs of one SAC update (target critic, two actor passes, critic fwd/bwd, actor bwd)."""
    fc, fc1 = mlp_flops(agent.critic, batch)
    fa, fa1 = mlp_flops(agent.actor, batch)
    # critic: target fwd + fwd + bwd(weights, inputs but the first) ; actor step: critic fwd + input bwd
    # actor: fwd for the target's next action + fwd + bwd(weights, inputs but the first)
    return (fc + fc + 2 * fc - fc1 + fc + fc) + (fa + fa + 2 * fa - fa1)


def build(cfg: SACConfig, seeds: int = 1) -> tuple[SAC, ReplayBuffer]:
    agent = SAC(OBS, ACT, cfg, SeedStreams(list(range(seeds))))
    buf = ReplayBuffer(10_000, OBS, ACT, seeds)
    g = torch.Generator().manual_seed(0)
    for _ in range(10_000):
        buf.add(torch.randn(seeds, OBS, generator=g), torch.rand(seeds, ACT, generator=g) * 2 - 1,
                torch.randn(seeds, generator=g), torch.randn(seeds, OBS, generator=g), torch.zeros(seeds))
    return agent, buf


def time_updates(agent: SAC, buf: ReplayBuffer, batch: int, count: int) -> float:
    """Seconds per update over ``count`` updates."""
    t = time.perf_counter()
    agent.train_steps(buf, count, batch)
    return (time.perf_counter() - t) / count


def roofline_rate(hidden: int, batch: int, iters: int = 20) -> float:
    """FLOP/s of forward+backward through plain nn.Linear MLPs with the agent's layer shapes."""
    critic_in, actor_in = OBS + ACT, OBS
    nets = [
        nn.Sequential(nn.Linear(critic_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)),
        nn.Sequential(nn.Linear(actor_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2 * ACT)),
    ]
    xs = [torch.randn(batch, critic_in), torch.randn(batch, actor_in)]
    flops = 0
    for net in nets:
        for m in net:
            if isinstance(m, nn.Linear):
                flops += 3 * 2 * batch * m.in_features * m.out_features - (2 * batch * m.in_features * m.out_features if m is net[0] else 0)
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

    def cfg(spectral: bool) -> SACConfig:
        c = SACConfig()
        c.actor.hidden = c.critic.hidden = [args.hidden, args.hidden]
        if spectral:
            c.actor.regularizers = [{"name": "spectral", "coef": 1e-4}]
            c.critic.regularizers = [{"name": "spectral", "coef": 1e-4}]
        return c

    plain, buf = build(cfg(False))
    spectral, _ = build(cfg(True))
    for agent in (plain, spectral):
        time_updates(agent, buf, args.batch, 16)
    t_plain, t_spec, t_roof = [], [], []
    flops = update_flops(plain, args.batch)
    for _ in range(args.repeats):
        t_plain.append(time_updates(plain, buf, args.batch, args.updates))
        t_spec.append(time_updates(spectral, buf, args.batch, args.updates))
        t_roof.append(flops / roofline_rate(args.hidden, args.batch))
    mp, ms, mr = (statistics.median(t) * 1e3 for t in (t_plain, t_spec, t_roof))
    print(f"threads={args.threads} batch={args.batch} hidden=2x{args.hidden} fp32, {flops / 1e9:.3f} GFLOP/update")
    print(f"  roofline (same-FLOP nn.Linear MLP fwd+bwd): {mr:7.3f} ms  ({flops / mr / 1e6:.0f} GFLOP/s)")
    print(f"  SAC update, plain:                          {mp:7.3f} ms  ratio to roofline {mp / mr:.3f}")
    print(f"  SAC update, spectral (actor + critic):      {ms:7.3f} ms  ratio to roofline {ms / mr:.3f}")
    print(f"  spectral on / off:                          {ms / mp:.3f}")


if __name__ == "__main__":
    main()
