"""Whole-process wall time of one small SAC job: ours against SBX's SAC (Stable Baselines Jax).

    pip install -e ".[bench]"
    python -m benchmarks.vs_sbx [--protocol training|e10|both] [--repeats 3] [--threads 2] [--steps 4000]
                                [--random-steps 1000] [--warmup]
    python -m benchmarks.vs_sbx --jobs train-fast,train-sbx --warmup  # the fast settings against SBX alone

The job, the two protocols and our rows: :mod:`benchmarks.whole_run`. SBX's ``SAC`` (``sbx-rl``, a
JAX port of Stable-Baselines3 on SB3's env loop and replay buffer) gets the same settings:
``MlpPolicy``, ``net_arch`` [256, 256] for actor and critics (its default too), ReLU, ``n_critics`` 2,
``optax.adam`` 3e-4 for actor, critics and temperature, batch 256, γ 0.99, τ 0.005,
``train_freq`` 1, ``gradient_steps`` 1, ``policy_delay`` 1 (its defaults), ``learning_starts`` =
``--random-steps`` (uniform-random actions until then, 3000 updates as ours), ``ent_coef="auto_1.0"``,
and our target entropy −|A|/2 (its ``"auto"`` default is −|A|), a 1 M buffer. What cannot be
matched, none of which changes the work per update: flax's default initialization (LeCun normal
weights, zero biases; ours orthogonal); the actor's mean and log σ as two output layers with log σ
clipped to [−20, 2] (ours one layer of 2|A| outputs, log σ squashed into [−10, 2]); the temperature
loss log α·(H − H̄) (ours α·(H − H̄)); no regularizer, diagnostics, TensorBoard or checkpoint (our
user-default rows have the default config's spectral regularizer). Threads: with ``--threads 1``
XLA runs on one thread (``vs_jax``'s flags); otherwise XLA's own thread pool takes every core (XLA
has no setting for another count), and torch, which SB3's replay buffer uses, gets ``--threads``.
SBX compiles its update with XLA in every process (JAX's persistent compilation cache is off by
default and stays off here, as a user gets it), and that compile is part of its time. Installs
nothing; without sbx-rl it says so in one line and exits with status 1.
"""

from __future__ import annotations

import argparse
import os

from benchmarks.vs_jax import XLA_ONE_THREAD
from benchmarks.whole_run import Peer, main, peer_job


def sbx_job(args: argparse.Namespace) -> None:
    """The SBX side, run in its own process (XLA's threads set before JAX is imported)."""
    if args.threads == 1:
        os.environ["XLA_FLAGS"] = XLA_ONE_THREAD
    import torch
    from sbx import SAC

    torch.set_num_threads(args.threads)
    peer_job(SAC, args)


PEER = Peer("sbx", "SBX", "benchmarks.vs_sbx", "sbx", 'pip install "sbx-rl>=0.28" (or -e ".[bench]")', sbx_job)

if __name__ == "__main__":
    main(PEER, __doc__.split("\n\n")[0])
