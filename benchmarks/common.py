"""Shared helpers of the benchmark scripts: a SAC agent on a filled buffer, interleaved timing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from sac_spectral.agents import SAC, ReplayBuffer, SACConfig
from sac_spectral.core.seeding import SeedStreams

OBS, ACT = 17, 6  # DMC cheetah-run


def sac_config(hidden: int = 256, spectral: bool = False, **kw: object) -> SACConfig:
    """Plain (or spectral-regularized) SAC with 2×``hidden`` MLPs and SACConfig overrides ``kw``."""
    cfg = SACConfig(**kw)  # type: ignore[arg-type]
    cfg.actor.hidden = [hidden, hidden]
    cfg.critic.hidden = [hidden, hidden]
    if spectral:
        cfg.actor.regularizers = [{"name": "spectral", "coef": 1e-4}]
        cfg.critic.regularizers = [{"name": "spectral", "coef": 1e-4}]
    return cfg


def build(cfg: SACConfig, seeds: int = 1, device: str = "cpu", size: int = 10_000) -> tuple[SAC, ReplayBuffer]:
    """An agent with ``seeds`` members and a buffer of ``size`` random cheetah-run-shaped transitions."""
    agent = SAC(OBS, ACT, cfg, SeedStreams(list(range(seeds)), device), device)
    buf = ReplayBuffer(size, OBS, ACT, seeds, device)
    g = torch.Generator().manual_seed(0)
    for _ in range(size):
        buf.add(*(t.to(device) for t in (
            torch.randn(seeds, OBS, generator=g), torch.rand(seeds, ACT, generator=g) * 2 - 1,
            torch.randn(seeds, generator=g), torch.randn(seeds, OBS, generator=g), torch.zeros(seeds))))
    return agent, buf


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_updates(agent: SAC, buf: ReplayBuffer, batch: int, count: int, calls: int = 1) -> float:
    """Seconds per update over ``calls`` calls of ``count`` updates each (as at replay ratio ``count``)."""
    device = str(buf.device)
    sync(device)
    t = time.perf_counter()
    for _ in range(calls):
        agent.train_steps(buf, count, batch)
    sync(device)
    return (time.perf_counter() - t) / (count * calls)


def per_call_us(fn: Callable[[], object], calls: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """µs per call over ``calls`` calls of ``fn``, by ``clock``."""
    start = clock()
    for _ in range(calls):
        fn()
    return (clock() - start) / calls * 1e6


def median_per_call_us(fn: Callable[[], object], calls: int, repeats: int, warmup: int = 1,
                       clock: Callable[[], float] = time.perf_counter) -> float:
    """The median over ``repeats`` blocks of :func:`per_call_us`, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    return statistics.median(per_call_us(fn, calls, clock) for _ in range(repeats))


def interleaved_medians(fns: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Call every function once per round for ``repeats`` rounds; the median of each."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            samples[k].append(fn())
    return {k: statistics.median(v) for k, v in samples.items()}
