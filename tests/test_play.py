"""load_policy and ``python -m sac_spectral.play``: a loaded policy replays the trainer's own
evaluation exactly; bad input fails in one line; videos render off-screen and decode."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SMALL

from sac_spectral.envs.evaluate import eval_seed
from sac_spectral.policy import load_policy, play_episodes
from sac_spectral.runs.checkpoint import CheckpointError, save_checkpoint
from sac_spectral.runs.cli import run_cli
from sac_spectral.runs.layout import CHECKPOINT, SUMMARY
from sac_spectral.train import main as train_main

ROOT = Path(__file__).resolve().parents[1]
# 250 agent steps per episode (DMC's 1000 at action repeat 4); two seeds to test seed_index
TINY = SMALL + [
    "env=dmc:cartpole-balance", "action_repeat=4", "num_seeds=2", "total_steps=400", "random_steps=100",
    "eval_every=200", "eval_episodes=2", "log_every=100", "buffer_size=5000", "diagnostics.every=0", "threads=1",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    rd = tmp_path_factory.mktemp("play") / "run"
    torch.set_num_threads(1)
    assert run_cli(train_main, TINY + [f"run_dir={rd}"]) == 0
    return rd


def play(*args, env=None):
    """``python -m sac_spectral.play`` in a fresh process (rendering picks its backend at import)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    env.pop("MUJOCO_GL", None)
    return subprocess.run([sys.executable, "-m", "sac_spectral.play", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)


def test_loaded_policy_replays_the_last_evaluation_exactly(run_dir):
    rows = list(csv.DictReader((run_dir / "evals.csv").open()))
    summary = json.loads((run_dir / SUMMARY).read_text())
    last_step = max(int(r["step"]) for r in rows)
    evaluations = len({r["step"] for r in rows})
    for index in (0, 1):
        policy = load_policy(run_dir, seed_index=index)
        seed = summary["seeds"][index]
        assert policy.seed == seed and policy.env_id == "dmc:cartpole-balance" and policy.step == 400
        seeds = [eval_seed(seed, evaluations - 1, ep) for ep in range(2)]
        assert policy.recorded is not None and policy.recorded.reset_seeds(seed) == seeds
        returns = play_episodes(policy, seeds)
        recorded = next(float(r["return"]) for r in rows if int(r["step"]) == last_step and int(r["seed"]) == seed)
        assert float(np.mean(returns)) == recorded == summary["per_seed"][index]["final_eval_return"]
    # the checkpoint file itself loads too, and the other seed acts differently
    a, b = load_policy(run_dir / CHECKPOINT, 0), load_policy(run_dir, 1)
    obs = a.observation_space.sample()
    assert not np.array_equal(a.act(obs), b.act(obs))


def test_act_one_observation_or_a_batch(run_dir):
    policy = load_policy(run_dir)
    assert policy.observation_space.shape == (5,) and policy.action_space.shape == (1,)
    batch = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    actions = policy.act(batch)
    assert actions.shape == (7, 1) and actions.dtype == np.float32
    single = np.stack([policy.act(o) for o in batch])
    np.testing.assert_allclose(actions, single, rtol=1e-5, atol=1e-6)  # other matmul shapes: rounding only
    assert all(policy.action_space.contains(a) for a in actions)
    sampled = policy.act(batch, deterministic=False)
    assert sampled.shape == (7, 1) and np.all(np.abs(sampled) <= 1) and not np.array_equal(sampled, actions)
    with pytest.raises(ValueError, match=r"observation \[5\]"):
        policy.act(np.zeros(4))


def test_import_stays_light_until_load_policy_is_used():
    code = ("import sys, sac_spectral; assert 'torch' not in sys.modules; "
            "f = sac_spectral.load_policy; assert 'torch' in sys.modules and callable(f)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_load_policy_refuses_what_it_cannot_load(run_dir, tmp_path):
    with pytest.raises(CheckpointError, match="no such run directory"):
        load_policy(tmp_path / "nothing")
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        load_policy(tmp_path)
    with pytest.raises(Exception, match="seed index 2 is out of range: the run has 2 seeds"):
        load_policy(run_dir, seed_index=2)
    continual = tmp_path / "continual.pt"
    save_checkpoint({"format": 1, "config": {}, "iteration": 3, "learner": {}}, continual)
    with pytest.raises(CheckpointError, match="continual"):
        load_policy(continual)
    old = tmp_path / "old.pt"
    save_checkpoint({"format": 1, "config": {}, "agent": {}}, old)
    with pytest.raises(CheckpointError, match="format 1"):
        load_policy(old)
    unsafe = tmp_path / "unsafe.pt"
    torch.save({"format": 2, "thing": Path("x")}, unsafe)
    with pytest.raises(CheckpointError, match="refused"):
        load_policy(unsafe)
    for path in (old, unsafe, continual):  # each error is one line
        with pytest.raises(CheckpointError) as err:
            load_policy(path)
        assert "\n" not in str(err.value)


def test_load_policy_maps_the_checkpoint_and_keeps_only_the_actor(run_dir, monkeypatch):
    import sac_spectral.policy as policy_module

    seen = {}
    real = policy_module.load_checkpoint

    def spy(path, mmap=False):
        seen["mmap"] = mmap
        return real(path, mmap=mmap)

    monkeypatch.setattr(policy_module, "load_checkpoint", spy)
    policy = load_policy(run_dir)
    assert seen["mmap"] is True
    assert {k.split(".")[0] for k in policy.actor.state_dict()} == {"layers", "heads"}


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["{run}", "--video", "{tmp}/x.avi"], "unknown extension '.avi'"),
        (["{tmp}/missing"], "no such run directory"),
        (["{run}", "--seed-index", "5"], "seed index 5 is out of range"),
        (["{run}", "--episodes", "0"], "not a positive integer"),
        (["{run}", "--video", "{tmp}/no/such/dir/x.gif"], "no such directory"),
        (["{run}", "--bogus"], "unrecognized arguments"),
    ],
)
def test_play_bad_input_is_one_line_and_exit_2(run_dir, tmp_path, capsys, args, fragment):
    from sac_spectral.play import main

    argv = [a.format(run=run_dir, tmp=tmp_path) for a in args]
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and fragment in err and "\n" not in err
    assert not list(tmp_path.glob("*.avi"))


def test_play_prints_returns_and_replays_the_last_evaluation(run_dir):
    out = play(run_dir, "--last-eval", "--seed-index", "1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("dmc:cartpole-balance: seed 1 (index 1 of 2) at step 400, deterministic, 2 episodes")
    mean = float(lines[-2].split()[1])
    assert lines[-1].startswith("recorded by the run at step 400: ") and float(lines[-1].split()[-1]) == mean
    stochastic = play(run_dir, "--episodes", "2", "--stochastic")
    assert stochastic.returncode == 0 and "stochastic, 2 episodes" in stochastic.stdout
    assert "± " in stochastic.stdout.splitlines()[-1]


def _gif_frames(path: Path) -> list[np.ndarray]:
    from PIL import Image, ImageSequence

    with Image.open(path) as im:
        return [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(im)]


def _mp4_frames(path: Path) -> list[np.ndarray]:
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    w, h = meta["size"]
    return [np.frombuffer(b, np.uint8).reshape(h, w, 3) for b in reader]


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_play_writes_a_rendered_video_of_the_first_episode(run_dir, tmp_path, suffix):
    if suffix == ".mp4":
        pytest.importorskip("imageio_ffmpeg")
    video = tmp_path / f"episode{suffix}"
    out = play(run_dir, "--episodes", "1", "--video", video, "--video-size", "64x48")
    assert out.returncode == 0, out.stderr
    frames = _gif_frames(video) if suffix == ".gif" else _mp4_frames(video)
    # 250 agent steps at 25 fps (0.04 s each: cartpole's 0.01 s control step × action repeat 4) + the reset
    assert len(frames) == 251 and frames[0].shape == (48, 64, 3)
    assert any(not np.array_equal(frames[0], f) for f in frames[1:])
    assert np.ptp(np.stack(frames)) > 50  # a picture, not a blank
    # rendering does not change the episode
    plain = play(run_dir, "--episodes", "1")
    assert plain.stdout.splitlines()[1].split()[:4] == out.stdout.splitlines()[1].split()[:4]


def test_training_records_evaluation_videos_to_files_and_tensorboard(tmp_path):
    """``video_every``: seed 0's first evaluation episode, as a file in videos/ and in TensorBoard,
    at the multiples of ``video_every`` and at the end."""
    rd = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("MUJOCO_GL", None)
    out = subprocess.run([sys.executable, "-m", "sac_spectral.train", *TINY, "total_steps=300", "video_every=200",
                          "progress=false", f"run_dir={rd}"], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    suffix = ".mp4" if _has_ffmpeg() else ".gif"
    videos = sorted((rd / "videos").iterdir())
    assert [v.name for v in videos] == [f"step_00000200{suffix}", f"step_00000300{suffix}"]
    frames = _mp4_frames(videos[0]) if suffix == ".mp4" else _gif_frames(videos[0])
    # 250 agent steps at 25 fps (cartpole's 0.01 s control step × action repeat 4) + the reset
    assert len(frames) == 251 and frames[0].shape == (240, 320, 3)
    assert any(not np.array_equal(frames[0], f) for f in frames[1:]) and np.ptp(np.stack(frames)) > 50
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(rd), size_guidance={"images": 0})
    acc.Reload()
    images = acc.Images("eval/video")
    assert [i.step for i in images] == [200, 300]
    assert images[0].encoded_image_string[:6] == b"GIF89a" and (images[0].height, images[0].width) == (120, 160)


def test_video_every_is_a_multiple_of_eval_every(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sac_spectral.train", *TINY, "video_every=300", f"run_dir={tmp_path / 'r'}"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 2 and "video_every" in out.stderr and "multiple of eval_every (200)" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def _has_ffmpeg() -> bool:
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return False
    return True
