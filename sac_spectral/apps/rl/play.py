"""``python -m sac_spectral.play RUN_DIR [--episodes N] [--stochastic] [--seed-index I] [--video FILE]``

Play a trained policy of a ``sac_spectral.train`` run (a run directory or its checkpoint file)
and print each episode's return and their mean ± std. Deterministic (``tanh(mean)``, as the
trainer evaluates) unless ``--stochastic``. ``--video FILE`` (.mp4 or .gif) renders the first
episode off-screen (``MUJOCO_GL=egl`` unless set); an existing regular file is replaced (a link:
its target), anything else refused. ``--last-eval`` replays the episodes of the run's last
evaluation (same reset seeds and env) next to the return it recorded.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from sac_spectral.apps.rl.config import MAX_SEED
from sac_spectral.apps.rl.policy import Policy, load_policy, play_episodes
from sac_spectral.core.config import ConfigError
from sac_spectral.core.seeding import derive_seed
from sac_spectral.envs.evaluate import eval_seed
from sac_spectral.runs.video import (
    DEFAULT_SIZE,
    check_video_path,
    gl_backend,
    rollout,
    use_offscreen_rendering,
    write_video,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (run_cli), as the other runners
        raise ConfigError(message)


def _size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m or int(m[1]) < 16 or int(m[2]) < 16:
        raise argparse.ArgumentTypeError(f"'{text}' is not WIDTHxHEIGHT (each >= 16), e.g. 320x240")
    return int(m[2]), int(m[1])


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive integer")
    return int(text)


def _seed(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_SEED:
        raise argparse.ArgumentTypeError(f"'{text}' is not a seed: give an integer in [0, {MAX_SEED}]")
    return int(text)


def play_seed(seed: int, episode: int) -> int:
    """The reset seed of episode ``episode`` (from 0) played with ``--seed seed``."""
    return derive_seed(seed, f"play/{episode}") % (2**31)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m sac_spectral.play", description=__doc__.split("\n\n", 1)[1].replace("``", ""),
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN_DIR", help="run directory of sac_spectral.train, or its checkpoint file")
    p.add_argument("--episodes", type=_positive, default=None,
                   help="episodes to play (default 5; --last-eval: the evaluation's)")
    p.add_argument("--stochastic", action="store_true", help="sample actions from the policy instead of tanh(mean)")
    p.add_argument("--seed-index", type=int, default=0, metavar="I", help="which seed of a multi-seed run (default 0)")
    p.add_argument("--seed", type=_seed, default=None,
                   help="seed of the episodes' resets and action noise (default: the run's seed)")
    p.add_argument("--last-eval", action="store_true",
                   help="replay the run's last evaluation instead (its reset seeds and episodes)")
    p.add_argument("--video", metavar="FILE", help="write the first episode as a video (.mp4 or .gif)")
    p.add_argument("--video-size", type=_size, default=DEFAULT_SIZE, metavar="WxH",
                   help=f"video frame size (default {DEFAULT_SIZE[1]}x{DEFAULT_SIZE[0]})")
    p.add_argument("--video-shadows", action="store_true",
                   help="draw shadows and reflections (about 7x slower in software OpenGL)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)  # one small forward per step
    gl_backend()  # an unknown MUJOCO_GL, or one whose library is missing, fails at the first env
    if args.video is not None:
        check_video_path(args.video)
        if args.video_size[0] % 2 or args.video_size[1] % 2:
            raise ConfigError("--video-size: width and height must be even, got "
                              f"{args.video_size[1]}x{args.video_size[0]}")
        use_offscreen_rendering()
    policy = load_policy(args.run, args.seed_index)
    seed = policy.seed if args.seed is None else args.seed
    if args.last_eval:
        if policy.recorded is None:
            raise ConfigError(f"{args.run}: its checkpoint was not written at an evaluation step; "
                              "--last-eval needs one")
        if args.stochastic:
            raise ConfigError("--last-eval replays the deterministic evaluation; leave out --stochastic")
        if args.episodes is not None and args.episodes != policy.recorded.episodes:
            raise ConfigError(f"--last-eval replays the evaluation's {policy.recorded.episodes} episodes; "
                              f"leave out --episodes {args.episodes}")
        episodes = policy.recorded.episodes
        reset_seed = functools.partial(eval_seed, policy.seed, policy.recorded.step)
    else:  # drawn per episode: a huge --episodes starts at once
        episodes, reset_seed = args.episodes or 5, functools.partial(play_seed, seed)
        policy.reseed(derive_seed(seed, "play"))
    mode = "stochastic" if args.stochastic else "deterministic"
    print(f"{policy.env_id}: seed {policy.seed} (index {policy.seed_index} of {policy.members}) at step {policy.step}, "
          f"{mode}, {episodes} episode{'s' * (episodes > 1)}", flush=True)
    env = policy.make_env()
    returns: list[float] = []
    try:
        for ep in range(episodes):
            if ep == 0 and args.video is not None:
                ret, note = _video_episode(policy, env, reset_seed(0), args)
            else:
                ret, note = play_episodes(policy, [reset_seed(ep)], not args.stochastic, env)[0], ""
            returns.append(ret)
            print(f"episode {ep + 1}: return {ret:.2f}{note}", flush=True)
    finally:
        env.close()
    r = np.asarray(returns)
    print(f"return: {r.mean():.2f} ± {r.std():.2f} (mean ± std over {len(r)} episodes)")
    if args.last_eval:
        assert policy.recorded is not None
        print(f"recorded by the run at step {policy.recorded.step}: {policy.recorded.mean_return:.2f}")
    return 0


def _video_episode(policy: Policy, env: gym.Env, reset_seed: int, args: argparse.Namespace) -> tuple[float, str]:
    """Play one episode rendered into ``args.video``: its return and what its line says of the video."""
    target = Path(os.path.realpath(args.video))
    link = f", a link to {target}" if Path(args.video).is_symlink() else ""
    replaced = "; replaced the existing file" if target.exists() else ""
    start = time.perf_counter()
    ret, frames, fps = rollout(lambda o: policy.act(o, not args.stochastic), env, reset_seed, args.video_size,
                               shadows=args.video_shadows)
    write_video(args.video, frames, fps)
    return ret, (f"  (video: {args.video}{link}, {len(frames)} frames at {fps:g} fps = {len(frames) / fps:.1f} s of "
                 f"video; rendered in {time.perf_counter() - start:.1f} s{replaced})")
