"""What each of the field's current agents costs per update, against plain SAC's update.

    python -m benchmarks.agent_costs [--threads 1] [--seeds 5] [--updates 20] [--repeats 5] [--eager]

The agents and critic heads of the priming and continual studies' arms
(``run_configs/sweeps/priming_agents.yaml``), on their shapes: DMC cartpole-swingup (obs 5,
action 1), batch 256, ``--seeds`` members in one process, compiled (``compile: true``) unless
``--eager``. One call of ``--updates`` updates per timing (as a priming phase runs them); medians
over interleaved repeats, so every agent sees the same machine load. Prints ms per update and the
ratio to SAC's scalar-head update.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import interleaved_medians, time_updates
from sac_spectral.agents import Agent, ReplayBuffer, build_agent
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.config import merge_sources
from sac_spectral.core.seeding import SeedStreams

OBS, ACT = 5, 1  # DMC cartpole-swingup
#: the arms, as the studies' sweep files give them (SAC's defaults otherwise: 2×256, two critics)
ARMS: dict[str, list[str]] = {
    "SAC, scalar head": [],
    "SAC, categorical head (two-hot)": ["critic.head=categorical"],
    "SAC, categorical head (HL-Gauss)": ["critic.head=categorical", "critic.projection=hl_gauss"],
    "SAC, quantile head": ["critic.head=quantile"],
    "SimbaV2 (128 wide, categorical)": [
        "actor.arch=simbav2", "actor.hidden=[128,128]", "critic.arch=simbav2", "critic.hidden=[128,128]",
        "critic.head=categorical", "critic.v_min=-5.0", "critic.v_max=5.0"],
    "DroQ (actor every update)": ["agent=droq", "droq.policy_delay=1"],
    "BroNet, quantile head": ["actor.arch=bronet", "critic.arch=bronet", "critic.head=quantile"],
}


def build(overrides: list[str], seeds: int, compiled: bool, size: int = 2_000) -> tuple[Agent, ReplayBuffer]:
    """The arm's agent with ``seeds`` members and a buffer of ``size`` random transitions."""
    cfg = merge_sources(TrainConfig, None, [*overrides, f"compile={str(compiled).lower()}", f"num_seeds={seeds}",
                                            "critic.regularizers=[]", "actor.regularizers=[]"])
    agent = build_agent(OBS, ACT, cfg, SeedStreams(list(range(seeds))))
    buf = ReplayBuffer(size, OBS, ACT, seeds, "cpu")
    g = torch.Generator().manual_seed(0)
    for _ in range(size):
        buf.add(torch.randn(seeds, OBS, generator=g), torch.rand(seeds, ACT, generator=g) * 2 - 1,
                torch.randn(seeds, generator=g), torch.randn(seeds, OBS, generator=g), torch.zeros(seeds))
    return agent, buf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--eager", action="store_true", help="time the eager update instead of the compiled one")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    setups = {name: build(o, args.seeds, not args.eager) for name, o in ARMS.items()}
    for agent, buf in setups.values():
        time_updates(agent, buf, args.batch, args.updates)  # compile and warm up
    t = interleaved_medians({name: (lambda a=a, b=b: time_updates(a, b, args.batch, args.updates))
                             for name, (a, b) in setups.items()}, args.repeats)
    base = t["SAC, scalar head"]
    print(f"threads={args.threads} seeds={args.seeds} batch={args.batch} "
          f"{'eager' if args.eager else 'compiled'}, cartpole shapes; median of {args.repeats}")
    print(f"{'agent':<36}{'ms/update':>10}{'× SAC':>8}")
    for name, s in t.items():
        print(f"{name:<36}{s * 1e3:>10.1f}{s / base:>8.2f}")


if __name__ == "__main__":
    main()
