"""Our SAC update against the same update in JAX (jaxrl's form), on the CPU.

    pip install -e ".[bench]"
    python benchmarks/vs_jax.py [--rounds 7] [--updates 20] [--configs 1x1,10x1,1x2busy,1x2] [--skip-check]
                                [--compile]
    python benchmarks/vs_jax.py --compile --block 8 --configs 1x1,10x1  # block rows: ours 8 updates per call
                                                                          # vs a scan of 8
    python benchmarks/vs_jax.py --compile --block 8 --split              # and each side's matmul time in its update
    python benchmarks/vs_jax.py --compile --configs 1x1 --processes 4    # rounds in 4 fresh sets of workers

Both sides run plain SAC (no regularizers) with cheetah-run dimensions (obs 17, action 6), 2×256
ReLU MLPs, two critics, batch 256, fp32, Adam 3e-4 (:mod:`benchmarks.jax_sac` is the JAX side).

1. Equivalence: a ``SAC``'s initial parameters are copied into the JAX state, both take 3 updates
   on identical batches and noise, and the largest absolute difference over all parameters
   (actor, critics, target critics, log α) is printed: PASS if ≤ 1e-6 (else exit 1); 1 and 2 seeds,
   torch on 1 thread (see :func:`check`).
2. Speed: ours is ``agent.train_steps(buffer, K, 256)`` on a filled replay buffer (indices and noise
   of K updates drawn at once, gathered, then K updates); JAX is a jitted ``update(state, buffer, key)``
   that draws indices and noise with ``jax.random`` and does one update, called K times from Python
   (``block_until_ready`` after the block), and, on its own line, K updates in one ``lax.scan``
   call. N seeds: ours has N members, JAX ``jax.vmap``s the update over N. Each side runs in its
   own worker process, configured before torch or JAX is imported and warmed up once (1 thread:
   torch/OpenMP 1 thread, XLA without multi-threaded Eigen and intra-op threads 1, both workers
   pinned to the same core). Per round the parent times one block of K updates on each side in
   turn (alternating which goes first); figures are medians over rounds, ``ours/jax`` is the
   median of the per-round ratios (> 1: JAX is faster). ``--processes P`` times the rounds in P
   fresh sets of workers, one after another, and pools all P × rounds samples: one process's
   speed can differ from the next one's by up to ±15 % on a VM, which one set of workers keeps.
   ``1x2busy``: 2 threads while a busy loop started by this script spins in another process; ``1x2``: without it
   (other load on the machine is not controlled: the load averages before and after are printed). ``1xauto-busy``:
   both sides with their default thread count, the busy loop running from before they start: ours
   chooses as a run with ``threads=0`` does at its start (the cores other processes left idle),
   JAX uses every core.
3. Spectral overhead (1x1): ours with ``run_configs/spectral.yaml``'s regularizers against ours
   plain, timed in the same rounds.

4. Blocks (``--compile --block B``): ours with ``compile_block=B`` (B updates per program call)
   and K = B updates per timed block, so that each timed block is one call on both sides, against
   JAX's ``lax.scan`` of B (the ``ours/jax-scan`` lines).
5. Split (``--split``): each side's matmul time inside its update (:mod:`benchmarks.matmul_split`:
   a profile of one block per round; JAX's is its scan), and the rest of each update (its time
   less its matmuls): which part the gap is in.

Output: the header lists what differs between the sides; per configuration, the median ms/update
of each side and ``ours/jax``. The last line, ``ours/jax: 1 seed 1 thread R | 10 seeds 1 thread R
| 1 seed 2 threads busy R | 1 seed block B R | 10 seeds block B R``, holds the ratios (``-`` where
not measured; the block ratios only with ``--block``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python benchmarks/vs_jax.py` imports this checkout's packages

from benchmarks.machine import machine_line  # noqa: E402

if TYPE_CHECKING:
    from sac_spectral.agents import SAC
    from sac_spectral.core.nets import BatchedLinear, BatchedMLP

BATCH, TOL, CHECK_UPDATES = 256, 1e-6, 3
OBS, ACT = 17, 6  # DMC cheetah-run, as benchmarks.common (which imports torch: not in the JAX worker)
#: name → (seeds, threads, busy co-runner, label)
CONFIGS = {
    "1x1": (1, 1, False, "1 seed 1 thread"),
    "10x1": (10, 1, False, "10 seeds 1 thread"),
    "1x2busy": (1, 2, True, "1 seed 2 threads busy"),
    "1x2": (1, 2, False, "1 seed 2 threads idle"),
    "1xauto-busy": (1, 0, True, "1 seed threads=0 busy"),
}
FINAL = ("1x1", "10x1", "1x2busy")
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
HEADER = """\
ours (sac_spectral.agents.SAC.train_steps) vs the same SAC update in JAX + optax (benchmarks/jax_sac.py, jaxrl's form):
plain SAC, cheetah-run dims (obs 17, act 6), 2x256 ReLU MLPs, 2 critics, batch 256, fp32, CPU
differences between the sides:
  - randomness: ours draws indices and noise from per-seed torch.Generator streams (CPU: mt19937)
    for all K updates of a block at once and gathers the K batches up front; JAX draws them with
    jax.random (threefry) inside each jitted update (the scan form: inside the scan)
  - ours runs eager torch ops (fused Adam), or with --compile one inductor program per update
    (critic step, Polyak step, actor and temperature step; with --block B, B updates per program)
    that writes the parameters and Adam state in place; JAX compiles the whole update (sampling included) into
    one XLA program, state buffers donated
  - both return the same per-update metrics (losses, mean Q, entropy) without reading them
  - timing data: 10 000 random transitions per seed of the same shapes and distributions, not the
    same values; each side initializes its own (orthogonal) parameters"""


# ----------------------------------------------------------------------------- workers
def serve(blocks: dict[str, Callable[[], float]]) -> None:
    """Answer each command line on stdin (a key of ``blocks``) with the block's seconds per update."""
    print("ready", flush=True)
    for line in sys.stdin:
        print(repr(blocks[line.strip()]()), flush=True)


def ours_worker(args: argparse.Namespace) -> None:
    import sac_spectral  # noqa: F401, I001  first: the project's OpenMP spin-wait, before torch loads libgomp
    import torch

    from benchmarks.common import build, sac_config, time_updates
    from benchmarks.matmul_split import torch_matmuls
    from sac_spectral.core.threads import choose_threads

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = sac_config(spectral=args.side == "ours-spectral", compile=args.compile, compile_block=args.block)
    agent, buf = build(cfg, args.seeds)
    time_updates(agent, buf, BATCH, args.updates)
    if not args.threads:  # as a run with threads=0 chooses at its start: the cores left idle since import
        torch.set_num_threads(choose_threads(0, torch.get_num_threads())[0])
    blocks = {"loop": lambda: time_updates(agent, buf, BATCH, args.updates), "threads": torch.get_num_threads}
    if args.split:
        blocks["mm"] = torch_matmuls(lambda: agent.train_steps(buf, args.updates, BATCH), args.updates)
    serve(blocks)


def jax_worker(args: argparse.Namespace) -> None:
    import jax

    from benchmarks.jax_sac import Hyper, JaxSAC, init_params
    from benchmarks.matmul_split import jax_matmuls

    n, k = args.seeds, args.updates
    sac = JaxSAC(Hyper(target_entropy=-0.5 * ACT))
    keys = jax.random.split(jax.random.key(0), n)
    state = sac.init_state(jax.vmap(lambda key: init_params(key, OBS, ACT, [256, 256], 2))(keys))
    rng, size = np.random.default_rng(0), 10_000
    buffer = jax.device_put({
        "obs": rng.standard_normal((n, size, OBS), np.float32),
        "action": rng.uniform(-1, 1, (n, size, ACT)).astype(np.float32),
        "reward": rng.standard_normal((n, size), np.float32),
        "next_obs": rng.standard_normal((n, size, OBS), np.float32),
        "terminated": np.zeros((n, size), np.float32)})
    carry = [state, keys]

    def loop() -> float:
        t = time.perf_counter()
        s, key = carry
        for _ in range(k):
            s, key, _ = sac.step(s, buffer, key)
        jax.block_until_ready(s)
        carry[:] = s, key
        return (time.perf_counter() - t) / k

    def scan() -> float:
        t = time.perf_counter()
        s, key, _ = sac.scan(carry[0], buffer, carry[1], k)
        jax.block_until_ready(s)
        carry[:] = s, key
        return (time.perf_counter() - t) / k

    loop(), scan()
    serve({"loop": loop, "scan": scan} | ({"mm": jax_matmuls(scan, k)} if args.split else {}))


def worker_main(args: argparse.Namespace) -> None:
    if args.core >= 0:
        os.sched_setaffinity(0, {args.core})
    (jax_worker if args.side == "jax" else ours_worker)(args)


class Worker:
    """One side's worker process; :meth:`block` times one block of updates."""

    def __init__(self, side: str, seeds: int, threads: int, core: int, args: argparse.Namespace) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else dict(os.environ)
        if side == "jax" and threads == 1:
            env["XLA_FLAGS"] = XLA_ONE_THREAD
        cmd = [sys.executable, __file__, "--worker", side, "--seeds", str(seeds), "--threads", str(threads),
               "--core", str(core), "--updates", str(args.updates), "--block",
               str(args.block)] + (["--compile"] if args.compile else []) + (["--split"] if args.split else [])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def wait_ready(self) -> None:
        if self.proc.stdout is None or self.proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"worker {self.proc.args} failed (exit {self.proc.wait()})")

    def block(self, kind: str = "loop") -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


# ----------------------------------------------------------------------------- timing
def run_config(name: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds per update of each side, one sample per round, over ``args.processes`` fresh sets of
    workers (``spectral``: ours with the paper's spectral regularizers, 1x1 only)."""
    sides = {"ours": "ours", "jax": "jax"} | ({"spectral": "ours-spectral"} if name == "1x1" else {})
    samples: dict[str, list[float]] = {k: [] for k in [*sides, "scan"] + (["ours-mm", "jax-mm"] if args.split else [])}
    for i in range(args.processes):
        time_workers(name, sides, args, samples)
        if args.processes > 1:
            last = {k: statistics.median(samples[k][-args.rounds:]) * 1e3 for k in ("ours", "jax", "scan")}
            print(f"  workers {i + 1}: ours {last['ours']:.3f} ms  jax {last['jax']:.3f} ms  jax scan "
                  f"{last['scan']:.3f} ms")
    return samples


def time_workers(name: str, sides: dict[str, str], args: argparse.Namespace, samples: dict[str, list[float]]) -> None:
    """Start one worker per side, warm them up, append ``args.rounds`` rounds to ``samples``."""
    seeds, threads, busy, _ = CONFIGS[name]
    core = max(os.sched_getaffinity(0)) if threads == 1 else -1
    # threads=0: the co-runner is there from the start, when ours chooses its thread count
    spin = [sys.executable, "-c", "while True: pass"]
    spinner = subprocess.Popen(spin) if busy and not threads else None
    workers: dict[str, Worker] = {}
    try:
        workers.update({k: Worker(side, seeds, threads, core, args) for k, side in sides.items()})
        for w in workers.values():
            w.wait_ready()
        if not threads:
            print(f"  ours chose {workers['ours'].block('threads'):.0f} thread(s); JAX uses its default (all cores)")
        spinner = subprocess.Popen(spin) if busy and threads else spinner
        for r in range(args.rounds):
            order = list(workers) if r % 2 == 0 else list(reversed(workers))
            for k in order:
                samples[k].append(workers[k].block())
            samples["scan"].append(workers["jax"].block("scan"))
            if args.split:
                samples["ours-mm"].append(workers["ours"].block("mm"))
                samples["jax-mm"].append(workers["jax"].block("mm"))
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
        for w in workers.values():
            w.close()


def report(name: str, s: dict[str, list[float]]) -> tuple[float, float]:
    """Print one configuration's lines; returns the median per-round ratios ours/JAX and
    ours/JAX-scan."""
    ms = {k: statistics.median(v) * 1e3 for k, v in s.items()}
    ratio = statistics.median(o / j for o, j in zip(s["ours"], s["jax"], strict=True))
    scan_ratio = statistics.median(o / j for o, j in zip(s["ours"], s["scan"], strict=True))
    print(f"{CONFIGS[name][3]}: ours {ms['ours']:.3f} ms  jax {ms['jax']:.3f} ms  ours/jax {ratio:.2f}")
    print(f"  jax lax.scan (one call per block): {ms['scan']:.3f} ms  ours/jax-scan {scan_ratio:.2f}")
    if "spectral" in s:
        overhead = statistics.median(p / o for p, o in zip(s["spectral"], s["ours"], strict=True)) - 1
        print(f"  spectral overhead: {overhead * 100:+.0f} % (ours with the spectral regularizers {ms['spectral']:.3f} "
              "ms)")
    if "ours-mm" in s:
        print(f"  matmuls in the update: ours {ms['ours-mm']:.3f} ms  jax {ms['jax-mm']:.3f} ms  ours/jax "
              f"{statistics.median(o / j for o, j in zip(s['ours-mm'], s['jax-mm'], strict=True)):.2f}; the rest: ours "
              f"{ms['ours'] - ms['ours-mm']:.3f} ms  jax scan {ms['scan'] - ms['jax-mm']:.3f} ms  jax loop "
              f"{ms['jax'] - ms['jax-mm']:.3f} ms")
    return ratio, scan_ratio


# ----------------------------------------------------------------------------- equivalence
def torch_params(agent: SAC) -> dict[str, Any]:
    """``agent``'s parameters as the JAX pytree (numpy leaves, seeds leading, critics ``[N, C, …]``)."""
    n, c = agent.num_seeds, agent.num_critics

    def lin(layer: BatchedLinear, lead: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        w, b = layer.weight.detach().numpy(), layer.bias.detach().numpy()
        return w.reshape(*lead, *w.shape[1:]).copy(), b.reshape(*lead, -1).copy()

    def critic(net: BatchedMLP) -> dict[str, Any]:
        return {"trunk": [lin(x, (n, c)) for x in net.layers], "out": lin(net.heads[0], (n, c))}

    actor = agent.actor
    return {
        "actor": {"trunk": [lin(x, (n,)) for x in actor.layers], "mean": lin(actor.heads[0], (n,)),
                  "log_std": lin(actor.heads[1], (n,))},
        "critic": critic(agent.critic), "target": critic(agent.target_critic),
        "log_alpha": agent.log_alpha.detach().numpy().copy(),
    }


def check(seeds: int, compile: bool) -> float:
    """Largest |parameter difference| after :data:`CHECK_UPDATES` updates on identical inputs.
    Torch runs on 1 thread: 2 threads sum in another order, and a rounding-size change that flips
    a ReLU near 0 (or the sign of a near-zero gradient in Adam's first, normalized steps) moves
    weights by ~lr; torch 1 thread vs 2 threads alone then differ by ~1e-3 on 2 seeds."""
    from sac_spectral.agents import SAC  # noqa: I001  first: imports sac_spectral before torch (OpenMP setting)
    import jax
    import torch

    from benchmarks.common import sac_config
    from benchmarks.jax_sac import Hyper, JaxSAC
    from sac_spectral.core.seeding import SeedStreams

    torch.set_num_threads(1)
    cfg = sac_config(compile=compile)
    agent = SAC(OBS, ACT, cfg, SeedStreams(list(range(seeds))))
    sac = JaxSAC(Hyper(cfg.gamma, cfg.tau, cfg.critic.lr, cfg.actor.lr, cfg.alpha.lr, cfg.actor.log_std_min,
                       cfg.actor.log_std_max, agent.target_entropy))
    state = sac.init_state(jax.tree.map(jax.numpy.asarray, torch_params(agent)))
    g = torch.Generator().manual_seed(1)
    nb = (seeds, BATCH)
    for _ in range(CHECK_UPDATES):
        batch = {"obs": torch.randn(*nb, OBS, generator=g), "action": torch.rand(*nb, ACT, generator=g) * 2 - 1,
                 "reward": torch.randn(*nb, generator=g), "next_obs": torch.randn(*nb, OBS, generator=g),
                 "terminated": (torch.rand(*nb, generator=g) < 0.1).float()}
        noise = torch.randn(2, *nb, ACT, generator=g)
        agent.update(batch, {"next_action": noise[0], "action": noise[1]})
        state, _ = sac.train_batch(state, {k: v.numpy() for k, v in batch.items()}, noise.numpy())
    ours = torch_params(agent)
    diffs = jax.tree.map(lambda a, b: float(np.abs(a - np.asarray(b)).max()), ours, {k: state[k] for k in ours})
    return max(jax.tree.leaves(diffs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--processes", type=int, default=1, help="time the rounds in this many fresh sets of worker "
                   "processes, one after another (one process's speed varies by up to ±15 %% on some VMs)")
    p.add_argument("--updates", type=int, default=20, help="K: updates per timed block")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--compile", action="store_true", help="ours with compile=true (the whole update compiled)")
    p.add_argument("--split", action="store_true",
                   help="also profile each side's matmul time in its update (benchmarks/matmul_split.py)")
    p.add_argument("--block", type=int, default=1, help="with --compile: ours runs this many updates per program "
                   "call (compile_block), and K becomes this")
    for flag, kind in (("--worker", str), ("--seeds", int), ("--threads", int), ("--core", int)):
        p.add_argument(flag, type=kind, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.side = args.worker
        worker_main(args)
        return
    if importlib.util.find_spec("jax") is None or importlib.util.find_spec("optax") is None:
        print('JAX or optax is not installed; nothing to compare (pip install -e ".[bench]")')
        return
    if args.block > 1:
        if not args.compile:
            p.error("--block needs --compile (blocks are compiled programs)")
        args.updates = args.block
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        p.error(f"unknown configs {unknown}; valid: {', '.join(CONFIGS)}")
    print(HEADER)
    print(f"ours: compile={'true' if args.compile else 'false'} compile_block={args.block}")
    if args.processes < 1:
        p.error(f"--processes must be at least 1, got {args.processes}")
    print(f"K = {args.updates} updates per block, {args.rounds} rounds × {args.processes} set(s) of workers; "
          f"load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(machine_line())
    if not args.skip_check:
        for seeds in (1, 2):
            diff = check(seeds, args.compile)
            print(f"equivalence, {seeds} seed(s), {CHECK_UPDATES} updates: max |param diff| {diff:.2e}  "
                  f"{'PASS' if diff <= TOL else 'FAIL'}", flush=True)
            if diff > TOL:
                sys.exit(1)
    ratios = {name: report(name, run_config(name, args)) for name in names}
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    cells = [f"{CONFIGS[n][3]} {f'{ratios[n][0]:.2f}' if n in ratios else '-'}" for n in FINAL]
    for n, label in (("1x1", "1 seed"), ("10x1", "10 seeds")):
        value = f"{ratios[n][1]:.2f}" if n in ratios and args.block > 1 else "-"
        cells.append(f"{label} block {args.block if args.block > 1 else 8} {value}")
    print("ours/jax: " + " | ".join(cells))


if __name__ == "__main__":
    main()
