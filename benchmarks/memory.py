"""Memory: peak RSS with a full 1 M-transition cheetah-run buffer, and RSS flatness over a run.

    python -m benchmarks.memory [--threads 2] [--steps 10000]

First trains the default agent (1 M-transition buffer, preallocated) for ``--steps`` env steps and
prints RSS every 1000 steps: after warm-up it should stay flat (no per-step growth beyond the
buffer's own 168 bytes per transition). Then fills a 1 M-transition buffer completely and runs
updates on it; prints the buffer's size and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile

import torch

from benchmarks.common import ACT, OBS, sac_config
from sac_spectral.agents import SAC, ReplayBuffer
from sac_spectral.apps.rl.train import TrainConfig, Trainer
from sac_spectral.core.config import merge_sources
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.runs.run import GracefulStop, Run


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=10_000)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        cfg = merge_sources(TrainConfig, None, [
            f"total_steps={args.steps}", "random_steps=1000", "eval_every=0", "eval_episodes=1",
            "checkpoint_every=0", "progress=false", f"threads={args.threads}", f"run_dir={tmp}/run",
            "buffer_size=1000000",
        ])
        trainer = Trainer(cfg)
        trainer.open_new()
        samples = []
        original = trainer._log

        def log_and_sample() -> None:
            samples.append((trainer.step, rss_mib()))
            original()

        trainer._log = log_and_sample  # type: ignore[method-assign]
        with GracefulStop() as stop:
            Run("sac_spectral.train", trainer, stop).execute()
    print("env step → RSS (MiB): " + ", ".join(f"{s}: {r:.0f}" for s, r in samples))
    (s0, r0), (s1, r1) = samples[len(samples) // 2], samples[-1]
    print(f"RSS growth over the second half ({s0} → {s1} steps): {r1 - r0:+.1f} MiB "
          f"(the buffer itself fills {(s1 - s0) * 168 / 2**20:.1f} MiB of preallocated pages)")

    base = rss_mib()
    agent = SAC(OBS, ACT, sac_config(), SeedStreams([0]))
    big = ReplayBuffer(1_000_000, OBS, ACT)
    for value in big.storage.values():
        value.normal_()
    big.size = big.capacity
    agent.train_steps(big, 64, 256)
    nbytes = sum(v.numel() * v.element_size() for v in big.storage.values())
    print(f"1M-transition buffer: {nbytes / 2**20:.0f} MiB of tensors; RSS {rss_mib():.0f} MiB "
          f"(process baseline {base:.0f} MiB); peak RSS {peak_rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
