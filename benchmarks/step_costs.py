"""What one env step of ``python -m sac_spectral.train`` costs outside the gradient update.

    python -m benchmarks.step_costs [--threads 1] [--repeats 7]

Times, in µs of CPU time of this thread (medians of ``--repeats`` blocks; CPU time rather than wall
time so that other processes on the machine distort it less), each piece of the training loop's
per-step work on dmc:cheetah-run with the default 2×256 actor: the env step (whole, and the parts
under gymnasium/shimmy), acting on one observation (stochastic and deterministic, and the pieces
of it), the buffer write as the runner does it (five tensor conversions, then ``add``) and with
NumPy arrays, the uniform warm-up action, the progress bar. Compare with one update
(``benchmarks.update_speed``): at replay ratio 1 these run once per update.
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable

import numpy as np
import torch
from tqdm import tqdm

import sac_spectral  # noqa: F401  (before torch: OpenMP settings)
from benchmarks.common import median_per_call_us
from sac_spectral.agents import SAC, ReplayBuffer
from sac_spectral.agents.networks import actor_mean_log_std, tanh_gaussian
from sac_spectral.apps.rl.train import TrainConfig
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.envs import EnvPool


def cost(fn: Callable[[], object], repeats: int, n: int = 2000) -> float:
    """Median over ``repeats`` blocks of µs of thread CPU time per call."""
    return median_per_call_us(fn, n, repeats, clock=time.thread_time)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = TrainConfig()
    pool = EnvPool(cfg.env, [0])
    streams = SeedStreams([0])
    agent = SAC(pool.obs_dim, pool.act_dim, cfg, streams)
    buf = ReplayBuffer(100_000, pool.obs_dim, pool.act_dim, 1)
    env = pool.envs[0]
    dmc = env.unwrapped._env  # shimmy keeps the dm_control environment here
    actions = np.zeros((1, pool.act_dim), dtype=np.float32)
    obs_np = pool.obs
    obs = torch.as_tensor(obs_np)
    tr = pool.step(actions)
    fields = (obs_np, actions, tr.reward, tr.next_obs, tr.terminated)

    def as_runner() -> None:
        buf.add(*(torch.as_tensor(x, dtype=torch.float32) for x in fields))

    bar = tqdm(total=10**9, unit="step", dynamic_ncols=True, file=io.StringIO())  # the runner's bar, drawn off-screen
    postfix = {"eval": "1.0", "sps": "100", "ups": "100"}
    rows = {
        "env: EnvPool.step": lambda: pool.step(actions),
        "env:   gymnasium env.step (wrappers, shimmy, dm_control)": lambda: env.step(actions[0]),
        "env:   dm_control env.step": lambda: dmc.step(actions[0]),
        "env:   MuJoCo physics.step": lambda: dmc.physics.step(),
        "act: SAC.act(obs).cpu().numpy(), stochastic": lambda: agent.act(obs).cpu().numpy(),
        "act: SAC.act(obs, deterministic=True) (evaluation)": lambda: agent.act(obs, deterministic=True),
        "act:   obs → tensor (torch.as_tensor)": lambda: torch.as_tensor(obs_np),
        "buffer: 5 × torch.as_tensor + add (as the runner does)": as_runner,
        "buffer: add(NumPy arrays)": lambda: buf.add(*fields),
        "warm-up action (SeedStreams.rand → NumPy)":
            lambda: (streams.rand("act", (pool.act_dim,)) * 2.0 - 1.0).cpu().numpy(),
        "progress bar: set_postfix + update": lambda: (bar.set_postfix(postfix, refresh=False), bar.update(1)),
        "np.isfinite(actions).all()": lambda: np.isfinite(actions).all(),
    }
    results = {name: cost(fn, args.repeats) for name, fn in rows.items()}
    with torch.inference_mode():  # the pieces of SAC.act, inside one inference-mode block as there
        x = obs.unsqueeze(1)
        mean, log_std = actor_mean_log_std(agent.actor, x, agent.cfg.actor)
        noise = streams.randn("act", (1, pool.act_dim))
        pieces = {
            "act:   actor forward (BatchedMLP, one observation)": lambda: agent.actor(x),
            "act:   mean and log-std from the actor (forward included)":
                lambda: actor_mean_log_std(agent.actor, x, agent.cfg.actor),
            "act:   exploration noise (SeedStreams.randn)": lambda: streams.randn("act", (1, pool.act_dim)),
            "act:   tanh_gaussian (sample and log-density)": lambda: tanh_gaussian(mean, log_std, noise),
            "act:   tanh(mean + exp(log_std)·noise) (sample only)": lambda: torch.tanh(mean + log_std.exp() * noise),
        }
        results.update({name: cost(fn, args.repeats) for name, fn in pieces.items()})
    print(f"threads={args.threads}; µs of thread CPU time per call, median of {args.repeats} blocks")
    for name, us in results.items():
        print(f"  {name:58s} {us:8.1f}")


if __name__ == "__main__":
    main()
