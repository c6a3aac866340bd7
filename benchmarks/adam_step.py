"""The compiled update's Adam step on its own, against optax's, on one thread.

    pip install -e ".[bench]"
    python benchmarks/adam_step.py [--seeds 1,10] [--rounds 7]

The parameters of plain SAC with cheetah-run shapes (an actor and two critics, 2×256, N seeds as
members): ours is :func:`sac_spectral.core.optim.adam_step_` (torch's fused kernel as an operator)
on them, through the operator's C++ CPU kernel as a compiled program calls it; optax's is ``optax.adam`` with
``apply_updates`` in one jitted function whose state buffers are donated. Prints the median ms per step of each and
ours / optax, with the CPU flags and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_flags  # noqa: E402

OBS, ACT, WIDTH = 17, 6, 256


def shapes(n: int) -> list[tuple[int, ...]]:
    """The actor's (mean and log-std heads) and the two critics' parameters of ``n`` seeds."""
    actor = [(n, WIDTH, OBS), (n, WIDTH), (n, WIDTH, WIDTH), (n, WIDTH), (n, ACT, WIDTH), (n, ACT), (n, ACT, WIDTH),
             (n, ACT)]
    critic = [(2 * n, WIDTH, OBS + ACT), (2 * n, WIDTH), (2 * n, WIDTH, WIDTH), (2 * n, WIDTH), (2 * n, 1, WIDTH),
              (2 * n, 1)]
    return actor + critic


def per_step(fn: object, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,10")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp
    import optax
    import torch

    from sac_spectral.core import native
    from sac_spectral.core.optim import adam_step_

    if (why := native.load()) is not None:
        sys.exit(f"adam_step: the C++ kernels are unavailable here: {why}")
    torch.set_num_threads(1)
    print(f"cpu flags: {cpu_flags()}; 1 thread; load average {os.getloadavg()[0]:.2f}")
    for n in (int(v) for v in args.seeds.split(",")):
        g = torch.Generator().manual_seed(0)
        params = [torch.randn(s, generator=g) * 0.1 for s in shapes(n)]
        grads = [torch.randn(s, generator=g) * 0.1 for s in shapes(n)]
        state = ([torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params],
                 [torch.zeros(()) for _ in params])

        def ours(params: list = params, grads: list = grads, state: tuple = state) -> None:
            adam_step_(params, grads, *state, 3e-4, (0.9, 0.999), 1e-8, 0.0, False)

        tx = optax.adam(3e-4)
        jparams = [jnp.asarray(p.numpy()) for p in params]
        jgrads = [jnp.asarray(p.numpy()) for p in grads]
        carry = [jparams, tx.init(jparams)]

        def update(p: list, opt_state: object, gr: list, tx: optax.GradientTransformation = tx) -> tuple:
            updates, opt_state = tx.update(gr, opt_state, p)
            return optax.apply_updates(p, updates), opt_state

        donated = jax.jit(update, donate_argnums=(0, 1))

        def theirs(carry: list = carry, donated: object = donated, jgrads: list = jgrads) -> None:
            carry[:] = donated(carry[0], carry[1], jgrads)
            jax.block_until_ready(carry[0])

        calls = max(5, 200 // n)
        ours(), theirs()
        times: dict[str, list[float]] = {"ours": [], "optax": []}
        for _ in range(args.rounds):
            times["ours"].append(per_step(ours, calls))
            times["optax"].append(per_step(theirs, calls))
        ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        ratio = statistics.median(a / b for a, b in zip(times["ours"], times["optax"]))
        count = sum(p.numel() for p in params)
        print(f"{n} seed(s), {count} parameters: ours {ms['ours']:.3f} ms  optax {ms['optax']:.3f} ms  ours/optax "
              f"{ratio:.2f}")


if __name__ == "__main__":
    main()
