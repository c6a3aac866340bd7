"""Compiled against eager updates of the engine, per agent and intervention, on any device: the
largest difference of any parameter or target after a few updates (same batches and noise), and
the time per update of each backend.

    python benchmarks/engine_equality.py                          # CPU, float32 and float64
    python benchmarks/engine_equality.py --device cuda --dtypes float32,float64 --time 256

A row per (agent, intervention, dtype): ``max |compiled − eager|``; with ``--time H`` also the
median milliseconds per update of a plain agent with H-H networks, batch 256, eager and compiled
(CUDA graphs on a GPU), and their ratio.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from sac_spectral.agents import AGENTS
from sac_spectral.agents.steps import Draws, draw_shapes
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.seeding import SeedStreams

INTERVENTIONS = {
    "none": None,
    "reset": {"name": "reset", "every": 2},
    "shrink_perturb": {"name": "shrink_perturb", "shrink": 0.5, "sigma": 1e-2, "every": 2},
    "redo": {"name": "redo", "tau": 0.5, "every": 2},
    "cbp": {"name": "cbp", "replacement_rate": 0.3, "maturity_threshold": 1},
    "plasticity_injection": {"name": "plasticity_injection", "at_step": 3},
}


def make(agent: str, intervention: str, device: str, hidden: int, compile_: bool, seeds: int = 2):
    cfg = TrainConfig(agent=agent, compile=compile_, device=device)
    cfg.critic.num_critics = 4 if agent == "redq" else 2
    cfg.redq.policy_delay = 2
    spec = INTERVENTIONS[intervention]
    for net in (cfg.actor, cfg.critic):
        net.hidden = [hidden, hidden]
        net.regularizers = [{"name": "spectral", "coef": 1e-2}] + ([dict(spec)] if spec else [])
    return AGENTS[agent](5, 2, cfg, SeedStreams(list(range(seeds)), device=device), device)


def batches(count: int, draws: Draws, seeds: int, batch: int, device: str):
    """``count`` batches and the named noise of an agent that draws ``draws``."""
    g = torch.Generator().manual_seed(0)
    for _ in range(count):
        data = {"obs": torch.randn(seeds, batch, 5, generator=g),
                "action": torch.rand(seeds, batch, 2, generator=g) * 2 - 1,
                "reward": torch.randn(seeds, batch, generator=g), "next_obs": torch.randn(seeds, batch, 5, generator=g),
                "terminated": torch.zeros(seeds, batch)}
        noise = {name: torch.randn(seeds, *shape, generator=g) for name, shape in draw_shapes(draws, batch).items()}
        yield {k: v.to(device) for k, v in data.items()}, {k: v.to(device) for k, v in noise.items()}


def difference(agent: str, intervention: str, device: str, dtype: torch.dtype, updates: int = 6) -> float:
    torch.set_default_dtype(dtype)
    try:
        eager, comp = make(agent, intervention, device, 16, False), make(agent, intervention, device, 16, True)
        for batch, noise in batches(updates, eager.draws, 2, 32, device):
            eager.update(batch, noise)
            comp.update(batch, noise)
        mine = comp.state_dict()
        return max((mine[k] - v).abs().max().item() for k, v in eager.state_dict().items() if v.is_floating_point())
    finally:
        torch.set_default_dtype(torch.float32)


def per_update_ms(device: str, hidden: int, compile_: bool, seeds: int, repeats: int = 50) -> float:
    agent = make("sac", "none", device, hidden, compile_, seeds)
    data = list(batches(repeats + 5, agent.draws, seeds, 256, device))
    times = []
    for i, (batch, noise) in enumerate(data):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        agent.update(batch, noise)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if i >= 5:
            times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--agents", default="sac,td3,redq")
    parser.add_argument("--interventions", default=",".join(INTERVENTIONS))
    parser.add_argument("--time", type=int, default=0, help="also time updates of H-H networks (0: no timing)")
    args = parser.parse_args()
    name = (torch.cuda.get_device_name() if args.device.startswith("cuda")
            else platform.processor() or platform.machine())
    print(f"device: {args.device} ({name}), torch {torch.__version__}")
    for dtype in args.dtypes.split(","):
        for agent in args.agents.split(","):
            for intervention in args.interventions.split(","):
                diff = difference(agent, intervention, args.device, getattr(torch, dtype))
                print(f"{agent:5s} {intervention:22s} {dtype:8s} max |compiled - eager| = {diff:.2e}", flush=True)
    if args.time:
        for seeds in (1, 10):
            eager = per_update_ms(args.device, args.time, False, seeds)
            comp = per_update_ms(args.device, args.time, True, seeds)
            print(f"sac {args.time}-{args.time}, {seeds} seeds: eager {eager:.2f} ms, compiled {comp:.2f} ms per "
                  "update "
                  f"({eager / comp:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
