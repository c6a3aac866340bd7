"""Cost of the diagnostics: gradient erank of a 2×256 critic, and their share of training time.

    python benchmarks/diagnostics_cost.py [--threads 1] [--examples 256] [--hidden 256] [--repeats 7]

On SAC with cheetah-run dimensions (obs 17, action 6; twin critics; fp32), in one process:

1. per-example gradient erank of the critic TD loss for ``--examples`` examples (closure with its
   TD target, Gram matrices, eigenvalues, erank) by the factored path (``method="auto"``) and by
   ``torch.func`` (``method="func"``), in ms and in SAC updates;
2. one full diagnostics call (``DiagnosticsConfig()`` defaults: probe batch, actor and critic
   gradient ranks per layer, weight spectra, features, dormant units) against ``every`` SAC
   updates: share = t_diag / (every · t_update + t_diag).

Medians over interleaved repeats, so both sides of each ratio see the same machine load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from sac_spectral.agents import SAC, ReplayBuffer, SACConfig
from sac_spectral.agents.probes import (
    DiagnosticsConfig,
    critic_td_loss,
    probe_batch,
    agent_diagnostics,
)
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.diagnostics import effective_rank, gradient_grams
from sac_spectral.diagnostics.metrics import singular_values_from_gram

OBS, ACT = 17, 6


def build(hidden: int) -> tuple[SAC, ReplayBuffer]:
    cfg = SACConfig()
    cfg.actor.hidden = cfg.critic.hidden = [hidden, hidden]
    agent = SAC(OBS, ACT, cfg, SeedStreams([0]))
    buf = ReplayBuffer(10_000, OBS, ACT, 1)
    g = torch.Generator().manual_seed(0)
    for _ in range(10_000):
        buf.add(torch.randn(1, OBS, generator=g), torch.rand(1, ACT, generator=g) * 2 - 1,
                torch.randn(1, generator=g), torch.randn(1, OBS, generator=g), torch.zeros(1))
    return agent, buf


def seconds(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--examples", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--updates", type=int, default=50, help="updates per timing of the update")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    agent, buf = build(args.hidden)
    dcfg = DiagnosticsConfig()
    batch, noise = probe_batch(agent, buf, args.examples, [0], tick=0)

    def critic_erank(method: str) -> torch.Tensor:
        loss, probe = critic_td_loss(agent, batch, noise[0])
        gram = gradient_grams(agent.critic, loss, probe, example_dim=1, method=method)["all"]
        return effective_rank(singular_values_from_gram(gram))

    def diagnostics() -> None:
        b, z = probe_batch(agent, buf, dcfg.batch_size, [0], tick=1)
        agent_diagnostics(agent, b, z, dcfg)

    erank_fast, erank_func = critic_erank("auto"), critic_erank("func")
    torch.testing.assert_close(erank_fast, erank_func, rtol=1e-4, atol=0)
    agent.train_steps(buf, 10, 256)
    diagnostics()
    t_upd, t_fast, t_func, t_diag = [], [], [], []
    for _ in range(args.repeats):
        t_upd.append(seconds(lambda: agent.train_steps(buf, args.updates, 256)) / args.updates)
        t_fast.append(seconds(lambda: critic_erank("auto")))
        t_func.append(seconds(lambda: critic_erank("func")))
        t_diag.append(seconds(diagnostics))
    upd, fast, func, diag = (statistics.median(t) * 1e3 for t in (t_upd, t_fast, t_func, t_diag))
    share = diag / (dcfg.every * upd + diag)
    print(f"threads={args.threads} hidden=2x{args.hidden} twin critics, {args.examples} examples, fp32 "
          f"(erank per critic {[round(e, 1) for e in erank_fast.tolist()]}); medians of {args.repeats} interleaved repeats")
    print(f"  SAC update (batch 256):                    {upd:8.2f} ms")
    print(f"  critic gradient erank, factored (auto):    {fast:8.2f} ms  = {fast / upd:6.2f} updates")
    print(f"  critic gradient erank, torch.func:         {func:8.2f} ms  = {func / upd:6.2f} updates"
          f"  (factored is {func / fast:.0f}x faster)")
    print(f"  full diagnostics call (defaults):          {diag:8.2f} ms  = {diag / upd:6.2f} updates")
    print(f"  share of training time at diagnostics.every={dcfg.every}: {100 * share:.2f} %")


if __name__ == "__main__":
    main()
