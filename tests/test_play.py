"""load_policy and ``python -m sac_spectral.play``: a loaded policy replays the trainer's own
evaluation exactly; bad input fails in one line; videos render off-screen and decode."""

import csv
import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import SMALL
from sac_spectral.apps.rl.policy import load_policy, play_episodes
from sac_spectral.apps.rl.train import main as train_main
from sac_spectral.core.config import ConfigError
from sac_spectral.envs.evaluate import eval_seed
from sac_spectral.runs.checkpoint import CheckpointError, save_checkpoint
from sac_spectral.runs.cli import run_cli
from sac_spectral.runs.layout import CHECKPOINT, SUMMARY
from sac_spectral.runs.video import library_loads

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
    env = {**{k: v for k, v in os.environ.items() if k != "MUJOCO_GL"}, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           **(env or {})}
    return subprocess.run([sys.executable, "-m", "sac_spectral.play", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)


def test_loaded_policy_replays_the_last_evaluation_exactly(run_dir):
    rows = list(csv.DictReader((run_dir / "evals.csv").open()))
    summary = json.loads((run_dir / SUMMARY).read_text())
    last_step = max(int(r["step"]) for r in rows)
    for index in (0, 1):
        policy = load_policy(run_dir, seed_index=index)
        seed = summary["seeds"][index]
        assert policy.seed == seed and policy.env_id == "dmc:cartpole-balance" and policy.step == 400
        seeds = [eval_seed(seed, last_step, ep) for ep in range(2)]
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
    import sac_spectral.apps.rl.policy as policy_module

    seen = {}
    real = policy_module.load_checkpoint

    def spy(path, mmap=False):
        seen["mmap"] = mmap
        return real(path, mmap=mmap)

    monkeypatch.setattr(policy_module, "load_checkpoint", spy)
    policy = load_policy(run_dir)
    assert seen["mmap"] is True
    assert {k.split(".")[1] for k in policy.net.state_dict()} == {"layers", "heads"}  # the actor alone


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["{run}", "--video", "{tmp}/x.avi"], "unknown extension '.avi'"),
        (["{tmp}/missing"], "no such run directory"),
        (["{run}", "--seed-index", "5"], "seed index 5 is out of range"),
        (["{run}", "--episodes", "0"], "not a positive integer"),
        (["{run}", "--video", "{tmp}/no/such/dir/x.gif"], "no such directory"),
        (["{run}", "--bogus"], "unrecognized arguments"),
        (["{run}", "--seed", "-5"], "argument --seed: '-5' is not a seed: give an integer in [0, 2147483647]"),
        (["{run}", "--seed", "2147483648"], "is not a seed"),
    ],
)
def test_play_bad_input_is_one_line_and_exit_2(run_dir, tmp_path, capsys, args, fragment):
    from sac_spectral.apps.rl.play import main

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
    other = play(run_dir, "--last-eval", "--episodes", "5")
    assert other.returncode == 2 and "replays the evaluation's 2 episodes; leave out --episodes 5" in other.stderr
    assert play(run_dir, "--last-eval", "--episodes", "2").returncode == 0
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
    out = subprocess.run([sys.executable, "-m", "sac_spectral.train", *TINY, "video_every=300",
                          f"run_dir={tmp_path / 'r'}"],
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


def _refused(out: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2 and nothing on stderr but one ``error: …`` line holding every fragment (after the
    start lines a fresh training run prints before it builds its envs)."""
    lines = out.stderr.strip().splitlines()
    err = "\n".join(line for line in lines if not line.startswith(("config: ", "compile: auto")))
    assert out.returncode == 2 and err.startswith("error: ") and "\n" not in err, (out.returncode, out.stderr)
    assert all(f in err for f in fragments), err
    return err


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
@pytest.mark.parametrize("kind", ["directory", "fifo", "link to a device"])
def test_play_refuses_a_video_path_that_is_not_a_regular_file_before_rendering(run_dir, tmp_path, suffix, kind):
    video = tmp_path / f"clip{suffix}"
    if kind == "directory":
        video.mkdir()
    elif kind == "fifo":
        os.mkfifo(video)
    else:
        video.symlink_to("/dev/null")
    out = play(run_dir, "--episodes", "1", "--video", video)
    _refused(out, str(video), "only a regular file (or a new name) can be written")
    assert out.stdout == ""  # refused before loading, playing or rendering anything
    assert [p.name for p in tmp_path.iterdir()] == [video.name]  # no temporary file left
    assert video.is_dir() if kind == "directory" else video.is_fifo() if kind == "fifo" else video.is_symlink()
    assert Path("/dev/null").is_char_device()


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_play_replaces_a_video_file_and_writes_through_a_link_saying_so(run_dir, tmp_path, suffix):
    if suffix == ".mp4":
        pytest.importorskip("imageio_ffmpeg")
    old = tmp_path / f"old{suffix}"
    old.write_text("an older video")
    out = play(run_dir, "--episodes", "1", "--video", old, "--video-size", "32x32")
    assert out.returncode == 0, out.stderr
    # 251 frames at 25 fps: 10.04 s of video; how long rendering took is said apart from it
    line = out.stdout.splitlines()[1]
    assert f"(video: {old}, 251 frames at 25 fps = 10.0 s of video; rendered in " in line, line
    assert line.endswith(" s; replaced the existing file)"), line
    assert len(_gif_frames(old) if suffix == ".gif" else _mp4_frames(old)) == 251
    # a symbolic link is followed: its target is written (replaced), the link stays
    target, link = tmp_path / f"target{suffix}", tmp_path / f"link{suffix}"
    target.write_text("an older video")
    link.symlink_to(target)
    out = play(run_dir, "--episodes", "1", "--video", link, "--video-size", "32x32")
    assert out.returncode == 0, out.stderr
    assert f"(video: {link}, a link to {os.path.realpath(target)}, 251 frames" in out.stdout
    assert "replaced the existing file)" in out.stdout
    assert link.is_symlink() and link.resolve() == target
    assert len(_gif_frames(target) if suffix == ".gif" else _mp4_frames(target)) == 251
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([old.name, target.name, link.name])
    new = tmp_path / f"new{suffix}"
    out = play(run_dir, "--episodes", "1", "--video", new, "--video-size", "32x32")
    assert out.returncode == 0 and "rendered in" in out.stdout and "replaced" not in out.stdout


def test_play_refuses_an_unknown_mujoco_gl_in_one_line(run_dir, tmp_path):
    for value in ("bogus", "EGL"):  # dm_control's names are case-sensitive
        out = play(run_dir, "--episodes", "1", env={"MUJOCO_GL": value})
        _refused(out, f"MUJOCO_GL={value!r}", "egl, osmesa, glfw or disable")
    video = tmp_path / "v.gif"
    out = play(run_dir, "--episodes", "1", "--video", video, env={"MUJOCO_GL": "bogus"})
    _refused(out, "MUJOCO_GL='bogus'")
    assert not video.exists()


@pytest.mark.parametrize("video", [["video_every=200"], []], ids=["with-videos", "without-videos"])
def test_train_refuses_an_unknown_mujoco_gl_in_one_line(tmp_path, video):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MUJOCO_GL": "bogus"}
    out = subprocess.run([sys.executable, "-m", "sac_spectral.train", *TINY, "total_steps=200", *video,
                          f"run_dir={tmp_path / 'r'}"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    _refused(out, "MUJOCO_GL='bogus'", "egl, osmesa, glfw or disable")


@pytest.mark.skipif(library_loads("OSMesa"), reason="libOSMesa is installed here")
def test_play_says_in_one_line_that_osmesa_is_missing(run_dir, tmp_path):
    for args in ([], ["--video", tmp_path / "v.gif"]):
        out = play(run_dir, "--episodes", "1", *args, env={"MUJOCO_GL": "osmesa"})
        _refused(out, "MUJOCO_GL=osmesa needs libOSMesa", "libosmesa6", "MUJOCO_GL=egl")


@pytest.mark.parametrize("display", [None, ":12345"])
def test_play_with_glfw_and_no_display_prints_one_line(run_dir, tmp_path, display):
    """Without DISPLAY glfw is refused before rendering; with a display that does not answer,
    rendering fails and only the error line is printed (no warnings, no teardown traceback)."""
    env = {"MUJOCO_GL": "glfw", "WAYLAND_DISPLAY": ""}
    out = play(run_dir, "--episodes", "1", "--video", tmp_path / "v.gif", "--video-size", "32x32",
               env={**env, "DISPLAY": display or ""})
    _refused(out, "glfw", "MUJOCO_GL=egl")
    assert not (tmp_path / "v.gif").exists()


def _edited_run(run_dir: Path, tmp_path: Path, edit) -> Path:
    """A copy of ``run_dir`` whose checkpoint ``edit(state)`` changed."""
    from sac_spectral.runs.checkpoint import load_checkpoint

    copy = tmp_path / "edited"
    shutil.copytree(run_dir, copy)
    state = load_checkpoint(copy / CHECKPOINT)
    edit(state)
    save_checkpoint(state, copy / CHECKPOINT)
    return copy


def _wider_input(state: dict) -> None:
    modules = state["agent"]["modules"]
    modules["actor.layers.0.weight"] = torch.cat([modules["actor.layers.0.weight"]] * 2, dim=2)


def _nan_weight(state: dict) -> None:
    state["agent"]["modules"]["actor.layers.1.weight"][0, 3, 4] = float("nan")


def _more_seeds(state: dict) -> None:
    state["config"]["num_seeds"] = 3


@pytest.mark.parametrize(
    "edit, args, fragments",
    [
        (_wider_input, [], ["its actor maps 10 observations to 1 actions", "dmc:cartpole-balance has (5,)"]),
        (_nan_weight, [], ["1 non-finite value", "layers.1.weight"]),
        (_more_seeds, ["--seed-index", "2"], ["num_seeds=3", "holds 2"]),
    ],
    ids=["wider-input", "nan-weight", "more-seeds"],
)
def test_play_refuses_a_hand_edited_checkpoint_in_one_line(run_dir, tmp_path, edit, args, fragments):
    out = play(_edited_run(run_dir, tmp_path, edit), "--episodes", "1", *args)
    _refused(out, "checkpoint ", *fragments)


def test_act_refuses_observations_that_are_not_finite_float32(run_dir):
    policy = load_policy(run_dir)
    with pytest.raises(ValueError, match=r"^observation not finite in float32 at \[2\] \(nan\)$"):
        policy.act(np.array([0.0, 0.0, np.nan, 0.0, 0.0]))
    batch = np.zeros((3, 5))
    batch[1, 0], batch[2, 4] = -np.inf, 1e39  # 1e39 is finite in float64 but overflows float32
    with pytest.raises(ValueError, match=r"at \[1, 0\] \(-inf\), \[2, 4\] \(1e\+39\)$") as err:
        policy.act(batch, deterministic=False)
    assert "\n" not in str(err.value)
    assert np.isfinite(policy.act(np.full(5, 3e38))).all()


def test_play_starts_at_once_however_many_episodes(run_dir, monkeypatch, capsys):
    """Reset seeds are drawn per episode: a billion episodes print their first lines at once."""
    import sac_spectral.apps.rl.play as play_module

    class Stop(Exception):
        pass

    calls = {"seeds": 0, "episodes": 0}
    real_seed, real_play = play_module.derive_seed, play_module.play_episodes

    def counted_seed(*args):
        calls["seeds"] += 1
        if calls["seeds"] > 10:
            raise Stop("reset seeds drawn ahead of the episodes")
        return real_seed(*args)

    def two_episodes(*args, **kw):
        calls["episodes"] += 1
        if calls["episodes"] > 2:
            raise Stop("two episodes played")
        return real_play(*args, **kw)

    monkeypatch.setattr(play_module, "derive_seed", counted_seed)
    monkeypatch.setattr(play_module, "play_episodes", two_episodes)
    with pytest.raises(Stop, match="two episodes played"):
        play_module.main([str(run_dir), "--episodes", "1000000000"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("deterministic, 1000000000 episodes") and lines[1].startswith("episode 1: return ")
    assert lines[2].startswith("episode 2: return ")


def test_load_policy_takes_any_integral_seed_index_and_refuses_others(run_dir):
    assert load_policy(run_dir, seed_index=np.int64(1)).seed_index == 1
    assert load_policy(run_dir, seed_index=np.uint8(0)).seed_index == 0
    for bad in (True, "0", 1.0, None):
        with pytest.raises(ConfigError,
                           match=r"^seed index .* is not an integer: the run has 2 seeds \(indices 0..1\)$"):
            load_policy(run_dir, seed_index=bad)
    with pytest.raises(ConfigError, match=r"^seed index -1 is out of range: the run has 2 seeds \(indices 0..1\)$"):
        load_policy(run_dir, seed_index=np.int64(-1))


@pytest.mark.parametrize("device", ["meta", torch.device("meta"), "tpu", "cuda"])
def test_load_policy_refuses_a_device_it_cannot_use(run_dir, device):
    if str(device) == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ConfigError, match=rf"^device: '{device}' is not available here; valid: cpu"):
        load_policy(run_dir, device=device)


def test_a_failed_render_is_one_error_without_a_teardown_report(monkeypatch):
    """A backend that fails while dm_control makes its context leaves a half-made ``MjrContext``
    whose ``__del__`` fails too: render raises one ConfigError and nothing reports that ``__del__``."""
    from sac_spectral.runs.video import render

    class HalfMadeContext:
        def __init__(self) -> None:
            raise RuntimeError("an OpenGL platform library has not been loaded into this process")

        def __del__(self) -> None:
            self._ptr()  # AttributeError, as MjrContext.free() reads the pointer __init__ never set

    class Physics:
        model = SimpleNamespace(light_castshadow=np.ones(2), mat_reflectance=np.ones(2))

        def render(self, *args, **kwargs):
            return HalfMadeContext()

    env = SimpleNamespace(_env=SimpleNamespace(physics=Physics()))
    env.unwrapped = env
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    with pytest.raises(ConfigError, match=r"^rendering failed \(RuntimeError: an OpenGL platform library") as err:
        render(env)
    assert "\n" not in str(err.value)
    del err
    gc.collect()
    assert reported == [] and Physics.model.light_castshadow.tolist() == [1, 1]


def test_a_bf16_run_plays_and_is_diagnosed_on_a_cpu_without_bf16(tmp_path, monkeypatch):
    """A run trained with precision=bf16 loads for acting and diagnosing where the CPU has no bf16
    matmuls (faked): neither uses bf16, and only training refuses it."""
    import sac_spectral.apps.rl.config as run_config
    from sac_spectral.apps.rl.diagnose import load_run
    from sac_spectral.apps.rl.policy import load_policy
    from sac_spectral.core.config import merge_sources
    from sac_spectral.runs.cli import run_cli
    from sac_spectral.train import main

    if run_config.cpu_bf16() is False:
        pytest.skip("this CPU cannot train the bf16 run")
    rd = tmp_path / "bf16"
    assert run_cli(main, [*SMALL, "env=dmc:cartpole-balance", "total_steps=120", "random_steps=100", "eval_every=0",
                          "precision=bf16", "threads=1", f"run_dir={rd}"]) == 0
    monkeypatch.setattr(run_config, "cpu_bf16", lambda: False)
    with pytest.raises(ConfigError, match="bf16"):
        merge_sources(run_config.TrainConfig, {"precision": "bf16"})
    policy = load_policy(rd)
    assert policy.act([0.0] * policy.obs_dim).shape == (policy.act_dim,)
    cfg, agent, _, _ = load_run(rd)
    assert cfg.precision == "fp32" and agent.num_updates == 20
