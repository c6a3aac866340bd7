"""Whole-process wall time of one small SAC job, ours against another library's SAC (the shared
parts of ``vs_sb3`` and ``vs_sbx``).

The job: DMC cheetah-run (through shimmy, flat float32 observations, for both sides), ``--steps``
env steps of which ``--random-steps`` uniform-random, then one update per env step (replay ratio 1),
batch 256, 2×256 ReLU MLPs, Adam 3e-4, γ 0.99, τ 0.005, learned α from 1.0 with our target entropy
−|A|/2, two critics, a 1 M replay buffer. Each job is one process, timed from its start to its exit
(imports, env creation, evaluation, logging and writing results included); the jobs alternate, round
after round, and each figure is the median of ``--repeats`` rounds.

Two protocols (``--protocol``), which differ only in evaluation (E(n): ``n`` episodes of the
uniform-random policy before training and ``n`` deterministic-policy episodes after it, what
``python -m sac_spectral.train`` does with ``eval_episodes=n`` when the run ends before its first
``eval_every``):

- ``training``: ours with ``eval_episodes=1`` (E(1)), the peer without any evaluation: the training
  figure (job ids ``train-default``, ``train-fast``, ``train-<peer>``);
- ``e10``: E(10) on both sides (ids ``default``, ``fast``, ``<peer>``).

Ours runs twice per protocol, as a user starts it (``threads=0``, TensorBoard, diagnostics every
1000 updates, a checkpoint at the end, the progress bar): the default config, and the default config
with the recommended fast settings (``compile=true``, and ``precision=bf16`` where the CPU has native
bf16; the compile is part of the time, from inductor's disk cache after a ``--warmup`` run). The
other rows a script adds get ``threads=--threads`` and no progress bar; the peer gets
``torch.set_num_threads(--threads)``.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.machine import machine_line

#: the peers' SAC settings: our default config's (a test compares them with ``TrainConfig()``)
HIDDEN, LR, BATCH, GAMMA, TAU, BUFFER, CRITICS, ALPHA_INIT, TARGET_ENTROPY_SCALE = (
    (256, 256), 3e-4, 256, 0.99, 0.005, 1_000_000, 2, 1.0, 0.5)


@dataclass(frozen=True)
class Protocol:
    """What each side evaluates: our overrides and the peer's episodes before and after training."""

    prefix: str
    ours: tuple[str, ...]
    ours_tag: str
    peer_episodes: int
    peer_tag: str


PROTOCOLS = {
    "training": Protocol("train-", ("eval_episodes=1",), "E(1)", 0, "no evaluation"),
    "e10": Protocol("", (), "E(10)", 10, "E(10)"),
}


@dataclass(frozen=True)
class Job:
    """One timed process: the peer's when ``peer_episodes`` is set, else ours with ``overrides``
    (``user_default``: as a user starts it; ``fast``: plus :func:`fast_settings`), compared with the
    peer job ``ref``."""

    label: str
    overrides: tuple[str, ...] = ()
    user_default: bool = False
    fast: bool = False
    peer_episodes: int | None = None
    ref: str | None = None


@dataclass(frozen=True)
class Peer:
    """The library compared with: its job id and row label, the module whose ``--peer-job`` runs it,
    the import that must succeed, how to install it, its job, and the script's extra rows."""

    id: str
    label: str
    module: str
    package: str
    install: str
    job: Callable[[argparse.Namespace], None]
    extra_jobs: dict[str, Job] = field(default_factory=dict)


def protocol_jobs(peer: Peer, protocols: list[str] | None = None) -> dict[str, Job]:
    """Per protocol (all by default): ours as a user runs it, ours with the fast settings, the peer."""
    jobs: dict[str, Job] = {}
    for p in (PROTOCOLS[name] for name in protocols or PROTOCOLS):
        ref = p.prefix + peer.id
        jobs[p.prefix + "default"] = Job(f"ours, default as a user runs it: {p.ours_tag}, threads=0", p.ours,
                                         user_default=True, ref=ref)
        jobs[p.prefix + "fast"] = Job(f"ours, fast settings as a user runs them: {p.ours_tag}", p.ours,
                                      user_default=True, fast=True, ref=ref)
        jobs[ref] = Job(f"{peer.label}, {p.peer_tag}", peer_episodes=p.peer_episodes)
    return jobs


def select(peer: Peer, jobs: str | None, protocol: str) -> dict[str, Job]:
    """The jobs of ``jobs`` (ids, comma-separated), else the rows of ``protocol`` (a name or ``both``)."""
    table = {**protocol_jobs(peer), **peer.extra_jobs}
    if jobs is None:
        return protocol_jobs(peer, list(PROTOCOLS) if protocol == "both" else [protocol])
    wanted = jobs.split(",")
    unknown = [k for k in wanted if k not in table]
    if unknown:
        raise SystemExit(f"unknown job {', '.join(unknown)}; valid: {', '.join(table)}")
    return {k: job for k, job in table.items() if k in wanted}


def fast_settings() -> list[str]:
    """The recommended fast settings (docs/speed.md): the compiled update, and bf16 matmuls where
    the CPU has native bf16 (at replay ratio 1 every ``train_steps`` call is one update, so
    ``compile_block`` has nothing to group)."""
    from sac_spectral.core.precision import cpu_bf16

    return ["compile=true"] + (["precision=bf16"] if cpu_bf16() else [])


def command(job: Job, args: argparse.Namespace, run_dir: Path, peer: Peer) -> list[str]:
    """The process of ``job``: ``python -m sac_spectral.train …`` or the peer module's ``--peer-job``."""
    size = [str(args.steps), str(args.random_steps)]
    if job.peer_episodes is not None:
        return [sys.executable, "-m", peer.module, "--peer-job", "--threads", str(args.threads),
                "--steps", size[0], "--random-steps", size[1], "--episodes", str(job.peer_episodes)]
    cmd = [sys.executable, "-m", "sac_spectral.train", f"total_steps={size[0]}", f"random_steps={size[1]}",
           f"run_dir={run_dir}"]
    if not job.user_default:
        cmd += [f"threads={args.threads}", "progress=false"]
    return cmd + list(job.overrides) + (fast_settings() if job.fast else [])


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


# ----------------------------------------------------------------------------------- the peer's side
def peer_kwargs(random_steps: int, act_dim: int) -> dict[str, Any]:
    """The keyword arguments of SB3's and SBX's ``SAC`` (same signature for these) for our settings."""
    return {
        "learning_rate": LR, "buffer_size": BUFFER, "learning_starts": random_steps, "batch_size": BATCH,
        "tau": TAU, "gamma": GAMMA, "train_freq": 1, "gradient_steps": 1, "ent_coef": f"auto_{ALPHA_INIT}",
        "target_entropy": -TARGET_ENTROPY_SCALE * act_dim,
        "policy_kwargs": {"net_arch": list(HIDDEN), "n_critics": CRITICS}, "seed": 0, "device": "cpu", "verbose": 0,
    }


def peer_job(sac: Callable[..., Any], args: argparse.Namespace) -> None:
    """The peer's side, in its own process: ``args.episodes`` random-policy episodes, training with
    ``sac`` (a SAC class of SB3's signature), ``args.episodes`` deterministic-policy episodes."""
    import warnings

    os.environ.setdefault("MUJOCO_GL", "disable")  # as envs.make_env: no rendering
    warnings.filterwarnings("ignore")
    import gymnasium as gym
    import numpy as np
    import shimmy
    from gymnasium.wrappers import DtypeObservation, FlattenObservation
    from stable_baselines3.common.evaluation import evaluate_policy

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
    model = sac("MlpPolicy", env, **peer_kwargs(args.random_steps, int(np.prod(env.action_space.shape))))
    model.learn(total_timesteps=args.steps)
    if args.episodes:
        evaluate_policy(model, eval_env, n_eval_episodes=args.episodes, deterministic=True)


# ----------------------------------------------------------------------------------- the parent
def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch threads of the peer and of our rows but the "
                                                          "user-default ones")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--random-steps", type=int, default=1000)
    p.add_argument("--protocol", choices=[*PROTOCOLS, "both"], default="both",
                   help="training: ours E(1), the peer no evaluation; e10: E(10) on both sides")
    p.add_argument("--jobs", help="job ids, comma-separated (instead of --protocol's)")
    p.add_argument("--warmup", action="store_true", help="run each job once untimed first")
    p.add_argument("--episodes", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--peer-job", action="store_true", help=argparse.SUPPRESS)
    return p


def rounds(jobs: dict[str, Job], args: argparse.Namespace, peer: Peer) -> dict[str, list[tuple[float, float]]]:
    """Wall and CPU seconds of every job in each of ``args.repeats`` rounds (after a warm-up round)."""
    with tempfile.TemporaryDirectory(prefix=f"vs_{peer.id}_") as tmp:
        n = iter(range(10**6))

        def cmd(job: Job) -> list[str]:
            return command(job, args, Path(tmp) / f"run{next(n)}", peer)

        if args.warmup:
            for job in jobs.values():
                timed(cmd(job))
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in jobs}
        for r in range(args.repeats):
            for k, job in jobs.items():
                times[k].append(timed(cmd(job)))
            print(f"  round {r} (wall s): " + ", ".join(f"{t[-1][0]:.1f}" for t in times.values()), flush=True)
    return times


def report(jobs: dict[str, Job], times: dict[str, list[tuple[float, float]]], peer: Peer) -> None:
    """Each job's median wall and CPU time, then peer time / our time for each row with its peer row."""
    wall = {k: statistics.median(t for t, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    print(f"{'':52s} {'wall s':>7s} {'CPU s':>7s}")
    for k, job in jobs.items():
        print(f"{job.label:52s} {wall[k]:7.1f} {cpu[k]:7.1f}")
    print(f"{peer.label} time / our time (wall; CPU time in brackets: less sensitive to other load on the machine):")
    for k, job in jobs.items():
        if job.ref in wall:
            print(f"  {job.label:52s} {wall[job.ref] / wall[k]:.2f}  ({cpu[job.ref] / cpu[k]:.2f})  "
                  f"vs {jobs[job.ref].label}")


def main(peer: Peer, description: str) -> None:
    """The script: the peer's job under ``--peer-job``, else the timed rounds and their report."""
    args = parser(description).parse_args()
    if args.peer_job:
        peer.job(args)
        return
    if importlib.util.find_spec(peer.package) is None:
        raise SystemExit(f"{peer.package} is not installed; nothing to compare ({peer.install})")
    jobs = select(peer, args.jobs, args.protocol)
    print(machine_line())
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"job: cheetah-run, {args.steps} steps ({args.random_steps} random), RR 1, threads {args.threads}; "
          f"whole-process wall time, median of {args.repeats} alternated runs"
          + (" after a warm-up run of each" if args.warmup else ""))
    report(jobs, rounds(jobs, args, peer), peer)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
