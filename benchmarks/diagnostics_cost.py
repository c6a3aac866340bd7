"""Cost of the diagnostics: gradient erank of a 2×256 critic, and their share of training time.

    python benchmarks/diagnostics_cost.py [--threads 1] [--examples 256] [--hidden 256] [--depth 2] [--repeats 7]
    python benchmarks/diagnostics_cost.py --arch simba --hidden 512 --depth 3 --skip-func   # simba.yaml's critic

On SAC with cheetah-run dimensions (obs 17, action 6; twin critics; fp32), in one process:

1. per-example gradient erank of the critic TD loss for ``--examples`` examples (closure with its
   TD target, Gram matrices, eigenvalues, erank) by the factored path (``method="auto"``) and by
   ``torch.func`` (``method="func"``), in ms and in SAC updates;
2. one full diagnostics call (``DiagnosticsConfig()`` defaults: probe batch, actor and critic
   gradient ranks per layer, weight spectra, features, dormant units) against ``every`` SAC
   updates: share = t_diag / (every · t_update + t_diag).

``--arch`` builds both networks as ``mlp``, ``bronet`` or ``simba`` of ``--depth`` hidden widths
(``[W] * (blocks + 1)`` for the residual ones). It prints the process's peak RSS and, for
``torch.func``, the size of its per-example gradients (B × parameters × 4 bytes, and the float64
copy its Gram takes); ``--skip-func`` leaves that path out where it does not fit in memory.

Medians over interleaved repeats, so both sides of each ratio see the same machine load.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable

import torch

from sac_spectral.agents import SAC, ReplayBuffer, SACConfig
from sac_spectral.agents.probes import (
    DiagnosticsConfig,
    agent_diagnostics,
    network_loss,
    probe_batch,
)
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.diagnostics import effective_rank, gradient_grams
from sac_spectral.diagnostics.metrics import singular_values_from_gram

OBS, ACT = 17, 6


def build(hidden: int, depth: int = 2, arch: str = "mlp") -> tuple[SAC, ReplayBuffer]:
    cfg = SACConfig()
    cfg.actor.hidden = cfg.critic.hidden = [hidden] * depth
    cfg.actor.arch = cfg.critic.arch = arch
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
    p.add_argument("--depth", type=int, default=2, help="hidden widths per network")
    p.add_argument("--arch", choices=("mlp", "bronet", "simba"), default="mlp")
    p.add_argument("--skip-func", action="store_true", help="leave out the torch.func path (B × P gradients in memory)")
    p.add_argument("--updates", type=int, default=50, help="updates per timing of the update")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    agent, buf = build(args.hidden, args.depth, args.arch)
    dcfg = DiagnosticsConfig()
    batch, noise = probe_batch(agent, buf, args.examples, [0], tick=0)

    def critic_erank(method: str) -> torch.Tensor:
        loss, probe = network_loss(agent, "critic", batch, noise)
        gram = gradient_grams(agent.critic, loss, probe, example_dim=1, method=method)["all"]
        return effective_rank(singular_values_from_gram(gram))

    def diagnostics() -> None:
        b, z = probe_batch(agent, buf, dcfg.batch_size, [0], tick=1)
        agent_diagnostics(agent, b, z, dcfg)

    erank_fast = critic_erank("auto")
    if not args.skip_func:
        torch.testing.assert_close(erank_fast, critic_erank("func"), rtol=1e-4, atol=0)
    agent.train_steps(buf, 10, 256)
    diagnostics()
    t_upd, t_fast, t_func, t_diag = [], [], [], []
    for _ in range(args.repeats):
        t_upd.append(seconds(lambda: agent.train_steps(buf, args.updates, 256)) / args.updates)
        t_fast.append(seconds(lambda: critic_erank("auto")))
        if not args.skip_func:
            t_func.append(seconds(lambda: critic_erank("func")))
        t_diag.append(seconds(diagnostics))
    upd, fast, diag = (statistics.median(t) * 1e3 for t in (t_upd, t_fast, t_diag))
    share = diag / (dcfg.every * upd + diag)
    params = sum(p.numel() for p in agent.critic.parameters() if p.requires_grad)
    print(f"threads={args.threads} {args.arch} {args.depth}x{args.hidden} twin critics ({params / 1e6:.2f} M "
          "parameters), "
          f"{args.examples} examples, fp32 "
          f"(erank per critic {[round(e, 1) for e in erank_fast.tolist()]}); medians of {args.repeats} interleaved "
          "repeats")
    print(f"  SAC update (batch 256):                    {upd:8.2f} ms")
    print(f"  critic gradient erank, factored (auto):    {fast:8.2f} ms  = {fast / upd:6.2f} updates")
    if t_func:
        func = statistics.median(t_func) * 1e3
        print(f"  critic gradient erank, torch.func:         {func:8.2f} ms  = {func / upd:6.2f} updates"
              f"  (factored is {func / fast:.0f}x faster)")
    gib = args.examples * params * (4 + 8) / 2**30
    print(f"  torch.func's per-example critic gradients and their float64 copy: {gib:.1f} GiB"
          f"{' (skipped)' if args.skip_func else ''}")
    print("  peak RSS of this process:                  "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:8.2f} GiB")
    print(f"  full diagnostics call (defaults):          {diag:8.2f} ms  = {diag / upd:6.2f} updates")
    print(f"  share of training time at diagnostics.every={dcfg.every}: {100 * share:.2f} %")


if __name__ == "__main__":
    main()
