"""Cost of a video of one evaluation episode: seconds per 1000-step DMC episode played without
rendering, rendered off-screen (MuJoCo, ``MUJOCO_GL=egl`` unless set) at two frame sizes (and with
shadows and reflections), and encoded as .gif and .mp4.

    python benchmarks/video_cost.py [--env dmc:cheetah-run] [--repeats 3]

A random policy acts (the policy's forward is the same with and without video). Frames are taken
at most 50 per simulated second (every 2nd step of a 100 Hz DMC task).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from sac_spectral.runs.video import use_offscreen_rendering

use_offscreen_rendering()  # before dm_control is imported

import numpy as np  # noqa: E402

from sac_spectral.envs import make_env, run_episode  # noqa: E402
from sac_spectral.runs.video import rollout, write_video  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="dmc:cheetah-run")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    env = make_env(args.env, 0)
    rng = np.random.default_rng(0)
    act = lambda obs: rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)  # noqa: E731

    def best(fn) -> float:
        times = []
        for r in range(args.repeats):
            start = time.perf_counter()
            fn(r)
            times.append(time.perf_counter() - start)
        return min(times)

    steps = []
    run_episode(act, env, 0, lambda e, t, d: steps.append(t))
    per_1000 = 1000.0 / steps[-1]
    rollout(act, env, 0, (48, 64))  # the GL context is made once per process (about a second or more)
    plain = best(lambda r: run_episode(act, env, r)) * per_1000
    print(f"{args.env}: {steps[-1]} steps per episode; seconds per 1000 steps (best of {args.repeats})")
    print(f"  {'no video:':28s}{plain:7.2f}")
    for size, shadows in (((120, 160), False), ((240, 320), False), ((240, 320), True)):
        out: dict = {}
        t = best(lambda r, out=out, size=size, shadows=shadows: out.update(
            zip(("ret", "frames", "fps"), rollout(act, env, r, size, shadows=shadows)))) * per_1000
        frames, fps = out["frames"], out["fps"]
        what = f"rendered {size[1]}x{size[0]}{' +shadows' if shadows else ''}:"
        print(f"  {what:28s}{t:7.2f}  ({len(frames)} frames at {fps:g} fps; +{t - plain:.2f} s)")
        if shadows:
            continue
        with tempfile.TemporaryDirectory() as d:
            for suffix in (".gif", ".mp4"):
                path = Path(d) / f"v{suffix}"
                enc = best(lambda r, path=path, frames=frames, fps=fps: write_video(path, frames, fps)) * per_1000
                print(f"    + write {suffix}:{'':15s}{enc:7.2f}  ({path.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
