"""Whole-process wall time of one small SAC job: ours against Stable-Baselines3's SAC.

    python -m benchmarks.vs_sb3 [--repeats 3] [--threads 2] [--steps 4000] [--random-steps 1000]
    python -m benchmarks.vs_sb3 --jobs fast,sb3 --warmup     # the fast settings against SB3 alone, after a warm-up run

The job: DMC cheetah-run (through shimmy, flat float32 observations, for both), ``--steps`` env
steps of which ``--random-steps`` uniform-random, one update per env step after them (3000
updates), batch 256, 2×256 ReLU MLPs, Adam 3e-4, γ 0.99, τ 0.005, learned α from 1.0, two
critics, a 1 M replay buffer. Time is measured from process start to exit (imports, env
creation, evaluation, logging and writing results included), runs alternate, and each figure is
the median of ``--repeats``. Rows compare like with like; ``E(n)`` is the evaluation both sides
do: ``n`` uniform-random-policy episodes before training and ``n`` deterministic-policy episodes
after it (what ``python -m sac_spectral.train`` does with ``eval_episodes=n`` when it evaluates only
at the end). SB3 gets ``torch.set_num_threads(--threads)`` and so does ours (``threads=N``), except
in the first two rows, ours exactly as a user starts it (``threads=0``, TensorBoard, diagnostics every
1000 updates, a checkpoint at the end, the progress bar): the default config, and the default
config with the recommended fast settings (``compile=true``, and ``precision=bf16`` where the CPU
has native bf16). ``compile=true`` includes compiling the update
(inductor caches its programs on disk, so only a machine's first such run compiles from scratch). Prints each time and
SB3 time / our time (targets: ≥ 1.5 for the default config, ≥ 1.6 for plain SAC). ``--jobs`` times a subset
(ids: default, fast, sb3, e1, e1-nodiag, e1-compile, plain, sb3-e1) and ``--warmup`` runs each once
untimed first (a warm inductor cache and file cache). Installs nothing; without stable-baselines3 it
says so and exits.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAIN = ["critic.regularizers=[]", "actor.regularizers=[]"]
NO_DIAGNOSTICS = ["diagnostics.every=0"]
FAST = "ours, fast settings as a user runs them: E(10)"
#: short id of each job → its row label
JOB_IDS = {
    "default": "ours, default as a user runs it: E(10), threads=0", "fast": FAST, "sb3": "SB3, E(10)",
    "e1": "ours, default config, E(1)", "e1-nodiag": "ours, default config, E(1), no diagnostics",
    "e1-compile": "ours, default config, E(1), compile=true", "plain": "ours, plain SAC, E(1), no diagnostics",
    "sb3-e1": "SB3, E(1)",
}


def fast_settings() -> list[str]:
    """The recommended fast settings (docs/speed.md): the compiled update, and bf16 matmuls where
    the CPU has native bf16 (at replay ratio 1 every ``train_steps`` call is one update, so
    ``compile_block`` has nothing to group)."""
    from sac_spectral.core.precision import cpu_bf16

    return ["compile=true"] + (["precision=bf16"] if cpu_bf16() else [])


def ours(args: argparse.Namespace, run_dir: Path, extra: list[str], user_default: bool = False) -> list[str]:
    job = [f"total_steps={args.steps}", f"random_steps={args.random_steps}", f"run_dir={run_dir}"]
    if not user_default:
        job += [f"threads={args.threads}", "progress=false"]
    return [sys.executable, "-m", "sac_spectral.train", *job, *extra]


def sb3(args: argparse.Namespace, episodes: int) -> list[str]:
    return [sys.executable, "-m", "benchmarks.vs_sb3", "--sb3-job", "--threads", str(args.threads),
            "--steps", str(args.steps), "--random-steps", str(args.random_steps), "--episodes", str(episodes)]


def sb3_job(args: argparse.Namespace) -> None:
    """The SB3 side, run in its own process."""
    import warnings

    os.environ.setdefault("MUJOCO_GL", "disable")  # as envs.make_env: no rendering
    warnings.filterwarnings("ignore")
    import gymnasium as gym
    import numpy as np
    import shimmy
    import torch
    from gymnasium.wrappers import DtypeObservation, FlattenObservation
    from stable_baselines3 import SAC
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(args.threads)
    gym.register_envs(shimmy)

    def make(seed: int) -> gym.Env:
        env = DtypeObservation(FlattenObservation(gym.make("dm_control/cheetah-run-v0")), np.float32)
        env.reset(seed=seed)
        env.action_space.seed(seed)
        return env

    env, eval_env = make(0), make(1)
    for _ in range(args.episodes):  # random-policy episodes, as our runner's first evaluation
        eval_env.reset()
        done = False
        while not done:
            _, _, terminated, truncated, _ = eval_env.step(eval_env.action_space.sample())
            done = terminated or truncated
    model = SAC(
        "MlpPolicy", env, learning_rate=3e-4, buffer_size=1_000_000, learning_starts=args.random_steps,
        batch_size=256, tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto",
        policy_kwargs={"net_arch": [256, 256]}, seed=0, device="cpu", verbose=0,
    )
    model.learn(total_timesteps=args.steps)
    if args.episodes:
        evaluate_policy(model, eval_env, n_eval_episodes=args.episodes, deterministic=True)


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system, all threads) of one process."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch threads of both sides (but the user-default row)")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--random-steps", type=int, default=1000)
    p.add_argument("--jobs", default=",".join(JOB_IDS), help="subset of " + ",".join(JOB_IDS))
    p.add_argument("--warmup", action="store_true", help="run each job once untimed first")
    p.add_argument("--episodes", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--sb3-job", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sb3_job:
        sb3_job(args)
        return
    if importlib.util.find_spec("stable_baselines3") is None:
        print("stable-baselines3 is not installed; nothing to compare (pip install stable-baselines3)")
        return
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"cores: {len(os.sched_getaffinity(0))}")
    print(f"job: cheetah-run, {args.steps} steps ({args.random_steps} random), RR 1, threads {args.threads}; "
          f"whole-process wall time, median of {args.repeats} alternated runs")
    with tempfile.TemporaryDirectory(prefix="vs_sb3_") as tmp:
        n = iter(range(10**6))

        def run_dir() -> Path:
            return Path(tmp) / f"run{next(n)}"

        every = {
            "ours, default as a user runs it: E(10), threads=0": lambda: ours(args, run_dir(), [], user_default=True),
            FAST: lambda: ours(args, run_dir(), fast_settings(), user_default=True),
            "SB3, E(10)": lambda: sb3(args, 10),
            "ours, default config, E(1)": lambda: ours(args, run_dir(), ["eval_episodes=1"]),
            "ours, default config, E(1), no diagnostics":
                lambda: ours(args, run_dir(), ["eval_episodes=1", *NO_DIAGNOSTICS]),
            "ours, default config, E(1), compile=true":
                lambda: ours(args, run_dir(), ["eval_episodes=1", "compile=true"]),
            "ours, plain SAC, E(1), no diagnostics":
                lambda: ours(args, run_dir(), ["eval_episodes=1", *PLAIN, *NO_DIAGNOSTICS]),
            "SB3, E(1)": lambda: sb3(args, 1),
        }
        unknown = sorted(set(args.jobs.split(",")) - set(JOB_IDS))
        if unknown:
            raise SystemExit(f"unknown job {', '.join(unknown)}; valid: {', '.join(JOB_IDS)}")
        jobs = {label: every[label] for key, label in JOB_IDS.items() if key in args.jobs.split(",")}
        if args.warmup:
            for cmd in jobs.values():
                timed(cmd())
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in jobs}
        for r in range(args.repeats):
            for name, cmd in jobs.items():
                times[name].append(timed(cmd()))
            print(f"  round {r} (wall s): " + ", ".join(f"{t[-1][0]:.1f}" for t in times.values()), flush=True)
    wall = {k: statistics.median(t for t, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    print(f"{'':52s} {'wall s':>7s} {'CPU s':>7s}")
    for name in jobs:
        print(f"{name:52s} {wall[name]:7.1f} {cpu[name]:7.1f}")
    print("SB3 time / our time (wall; CPU time in brackets: less sensitive to other load on the machine):")
    for name, ref in [
        ("ours, default as a user runs it: E(10), threads=0", "SB3, E(10)"),
        (FAST, "SB3, E(10)"),
        ("ours, default config, E(1)", "SB3, E(1)"),
        ("ours, default config, E(1), no diagnostics", "SB3, E(1)"),
        ("ours, default config, E(1), compile=true", "SB3, E(1)"),
        ("ours, plain SAC, E(1), no diagnostics", "SB3, E(1)"),
    ]:
        if name in wall and ref in wall:
            print(f"  {name:52s} {wall[ref] / wall[name]:.2f}  ({cpu[ref] / cpu[name]:.2f})  vs {ref}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
