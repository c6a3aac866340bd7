"""Whole-process wall time of one small SAC job: ours against Stable-Baselines3's SAC.

    python -m benchmarks.vs_sb3 [--protocol training|e10|both] [--repeats 3] [--threads 2] [--steps 4000]
                                [--random-steps 1000] [--warmup]
    python -m benchmarks.vs_sb3 --jobs train-fast,train-sb3 --warmup  # the fast settings against SB3 alone

The job, the two protocols and our rows: :mod:`benchmarks.whole_run`. SB3 gets the same settings
(its ``SAC`` with ``MlpPolicy``, ``net_arch`` [256, 256], ``n_critics`` 2, ``learning_starts`` =
``--random-steps``, ``ent_coef="auto_1.0"`` and our target entropy −|A|/2). What differs: SB3
initializes its layers as ``nn.Linear`` does (ours orthogonally), clips log σ to [−20, 2] (ours
squashes it into [−10, 2]), and runs no regularizer, diagnostics, TensorBoard or checkpoint (our
user-default rows do: the spectral regularizer of the default config). More rows for ``--jobs``,
ours with ``threads=--threads`` and no progress bar against SB3 with E(1): ``e1`` (default config,
E(1)), ``e1-nodiag`` (without diagnostics), ``e1-compile`` (``compile=true``), ``plain`` (plain SAC
without diagnostics), ``sb3-e1`` (SB3, E(1)). Installs nothing; without stable-baselines3 it says so
in one line and exits with status 1.
"""

from __future__ import annotations

import argparse

from benchmarks.whole_run import Job, Peer, main, peer_job

PLAIN = ("critic.regularizers=[]", "actor.regularizers=[]")
NO_DIAGNOSTICS = ("diagnostics.every=0",)
E1 = ("eval_episodes=1",)


def sb3_job(args: argparse.Namespace) -> None:
    """The SB3 side, run in its own process."""
    import torch
    from stable_baselines3 import SAC

    torch.set_num_threads(args.threads)
    peer_job(SAC, args)


PEER = Peer("sb3", "SB3", "benchmarks.vs_sb3", "stable_baselines3", "pip install stable-baselines3", sb3_job, {
    "e1": Job("ours, default config, E(1)", E1, ref="sb3-e1"),
    "e1-nodiag": Job("ours, default config, E(1), no diagnostics", E1 + NO_DIAGNOSTICS, ref="sb3-e1"),
    "e1-compile": Job("ours, default config, E(1), compile=true", (*E1, "compile=true"), ref="sb3-e1"),
    "plain": Job("ours, plain SAC, E(1), no diagnostics", E1 + PLAIN + NO_DIAGNOSTICS, ref="sb3-e1"),
    "sb3-e1": Job("SB3, E(1)", peer_episodes=1),
})

if __name__ == "__main__":
    main(PEER, __doc__.split("\n\n")[0])
