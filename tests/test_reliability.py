"""Issue 12's attacks, scaled down: one regression test per defect (numbered as in the issue), and
the guarantees they rest on (checkpoint checksums, run-directory locks, memory estimates)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from conftest import SMALL
from sac_spectral.apps.continual import runner as continual
from sac_spectral.apps.rl import diagnose, train
from sac_spectral.apps.rl.run import missing_compiler
from sac_spectral.core import sizes
from sac_spectral.core.config import ConfigError, read_yaml
from sac_spectral.core.optim import make_optimizer
from sac_spectral.regularizers import REGISTRY
from sac_spectral.runs import checkpoint, cli, layout, memory, rundir
from sac_spectral.runs.checkpoint import CheckpointError, load_checkpoint
from sac_spectral.runs.cli import run_cli
from sac_spectral.runs.evals import read_evals
from sac_spectral.runs.kinds import dir_kind, run_kind
from sac_spectral.runs.layout import CHECKPOINT, SUMMARY
from sac_spectral.runs.logger import state_is_finite
from sac_spectral.studies import sweep, trial
from sac_spectral.supervised.datasets import DataError, load_dataset
from sac_spectral.supervised.learner import ContinualLearner

ROOT = Path(__file__).resolve().parents[1]
RL = SMALL + ["env=dmc:cartpole-balance", "random_steps=50", "eval_every=0", "diagnostics.every=0", "threads=1",
              "buffer_size=2000", "log_every=50"]
CL = ["progress=false", "threads=1", "model.width=16", "batch_size=16", "log_every=10", "stream.num_tasks=2",
      "stream.iters_per_task=20", "stream.subset=64", "gradient_diagnostics=false"]


def T(*args: object) -> int:
    return run_cli(train.main, [str(a) for a in args])


def C(*args: object) -> int:
    return run_cli(continual.main, [str(a) for a in args])


def D(*args: object) -> int:
    return run_cli(diagnose.main, [str(a) for a in args])


#: what a run prints on stderr when it starts (its directory and config line), before any error
START_LINES = ("run directory: ", "resuming ", "config: ")


def one_error(capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    """Besides the start lines of a run that got going, the run printed exactly one line on
    stderr, an ``error:`` line holding every fragment."""
    lines = capsys.readouterr().err.strip().splitlines()
    err = "\n".join(line for line in lines if not line.startswith(START_LINES))
    assert err.startswith("error: ") and "\n" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    assert "weights_only=False" not in err
    return err


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() if p.is_file() else b"<dir>" for p in [path, *path.rglob("*")] if path.exists()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished RL run (150 steps, checkpoints every 50) and a finished continual run."""
    root = tmp_path_factory.mktemp("finished")
    torch.set_num_threads(1)
    assert T(*RL, "total_steps=150", "checkpoint_every=50", f"run_dir={root / 'rl'}") == 0
    assert C(*CL, f"run_dir={root / 'cl'}") == 0
    return {"rl": root / "rl", "cl": root / "cl"}


@pytest.fixture
def rl_run(finished: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished["rl"], tmp_path / "rl"))


@pytest.fixture
def cl_run(finished: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished["cl"], tmp_path / "cl"))


# ----------------------------------------------------------------------------- 1: optimizer state
def test_state_is_finite_sees_optimizer_moments_floats_and_nesting():
    opt_state = {"state": {0: {"step": torch.tensor(3.0), "exp_avg_sq": torch.tensor([1.0, float("inf")])}}}
    assert not state_is_finite({"agent": {"critic_opt": opt_state}})
    assert not state_is_finite({"evals": [{"returns": [1.0, float("nan")]}]})
    assert state_is_finite({"rng": torch.tensor([255], dtype=torch.uint8), "x": [torch.ones(2), (3.0, None, "s")]})


def test1_overflowing_adam_moments_stop_the_run_and_keep_a_finite_checkpoint(tmp_path, capsys):
    """lr = 1000 sends the critic's Adam second moments to inf within the first updates (the code
    before the fix finished such runs with exit 0 and inf moments in its final checkpoint)."""
    rd = tmp_path / "run"
    assert T(*RL, "total_steps=600", "checkpoint_every=25", "critic.lr=1e3", "actor.lr=1e3", f"run_dir={rd}") == 1
    one_error(capsys, "non-finite", "optimizer state", "last good checkpoint is kept")
    state = load_checkpoint(rd / CHECKPOINT)
    assert state_is_finite(state) and state["step"] < 600
    assert not (rd / "summary.json").exists()


def test1_continual_finite_check_covers_the_optimizer_state():
    cfg = continual.ContinualConfig()
    cfg.model.width, cfg.stream.num_tasks, cfg.regularizers = 8, 1, []
    runner = continual.ContinualRunner(cfg)
    x, y = runner.stream.task(0).train_batch(runner.gen, 8)
    runner.learner.train_step(x, y)
    assert runner.finite()
    next(iter(runner.learner.optimizer.state.values()))["exp_avg_sq"].fill_(float("inf"))
    assert not runner.finite()


# ----------------------------------------------------------------------------- 2: hand-edited config
def _edit(rd: Path, key: str, value: object) -> None:
    data = yaml.safe_load((rd / "config.yaml").read_text())
    node = data
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    (rd / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.parametrize("key, value", [("replay_ratio", 4.0), ("env", "dmc:cheetah-run"), ("critic.hidden", [64, 64])])
def test2_a_hand_edited_fixed_key_is_refused_on_resume(rl_run, capsys, key, value):
    _edit(rl_run, key, value)
    before = snapshot(rl_run)
    assert T("--resume", rl_run, "total_steps=200") == 2
    one_error(capsys, f"{key} is {value!r} in config.yaml", "in the checkpoint")
    assert snapshot(rl_run) == before


def test2_continual_resume_refuses_an_edited_key_and_accepts_an_edited_resumable_one(cl_run, capsys):
    _edit(cl_run, "optimizer.lr", 0.5)
    before = snapshot(cl_run)
    assert C("--resume", cl_run, "stream.num_tasks=3") == 2
    one_error(capsys, "optimizer.lr is 0.5")
    assert snapshot(cl_run) == before
    _edit(cl_run, "optimizer.lr", 1e-3)
    _edit(cl_run, "stream.num_tasks", 3)  # resumable: editing the file is as good as an override
    assert C("--resume", cl_run) == 0
    assert load_checkpoint(cl_run / CHECKPOINT)["iteration"] == 60


def test_config_checkpoint_and_summary_record_the_run_kind_and_only_older_runs_are_told_by_their_keys(rl_run, cl_run):
    for run_dir, kind in ((rl_run, "train"), (cl_run, "continual")):
        assert load_checkpoint(run_dir / CHECKPOINT)["kind"] == kind
        assert json.loads((run_dir / SUMMARY).read_text())["kind"] == kind
        assert (run_dir / "config.yaml").read_text().startswith(f"# kind: {kind} ")
        assert dir_kind(run_dir, {}) == kind  # the summary's record
        (run_dir / SUMMARY).unlink()  # a run in progress: config.yaml's first line says it
        assert dir_kind(run_dir, {}) == kind
        text = (run_dir / "config.yaml").read_text()
        (run_dir / "config.yaml").write_text(text.split("\n", 1)[1])  # written before runs recorded their kind
        assert dir_kind(run_dir, read_yaml(run_dir / "config.yaml")) == kind
        (run_dir / "config.yaml").write_text(text)
    assert run_kind({"env": "x"}, {"kind": "continual"}) == "continual" and run_kind({"env": "x"}, {}) == "train"


def test2_the_checkpoint_records_the_resolved_config_without_run_dir(rl_run):
    recorded = load_checkpoint(rl_run / CHECKPOINT)["config"]
    saved = read_yaml(rl_run / "config.yaml")
    assert recorded == {k: v for k, v in saved.items() if k != "run_dir"}


# ----------------------------------------------------------------------------- 3: total_steps below
def test3_resume_below_the_current_position_is_refused_and_the_record_kept(rl_run, cl_run, capsys):
    before = snapshot(rl_run)
    assert T("--resume", rl_run, "total_steps=100") == 2
    one_error(capsys, "total_steps=100 is below the run's current step 150")
    assert snapshot(rl_run) == before
    before = snapshot(cl_run)
    assert C("--resume", cl_run, "stream.num_tasks=1") == 2
    one_error(capsys, "stream.num_tasks=1", ">= 2")
    assert snapshot(cl_run) == before


# ----------------------------------------------------------------------------- 4: broken checkpoints
def _damage(kind: str, path: Path) -> None:
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(random.Random(0).randbytes(len(data)))
    elif kind == "flipped":  # bits of a tensor record: torch.load alone would not notice
        with zipfile.ZipFile(path) as z:
            rec = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        n, e = struct.unpack("<HH", data[rec.header_offset + 26: rec.header_offset + 30])
        start = rec.header_offset + 30 + n + e
        path.write_bytes(data[:start] + bytes(b ^ 0xFF for b in data[start: start + 8]) + data[start + 8:])
    elif kind == "malicious":
        class Evil:
            def __reduce__(self):
                return (os.system, (f"touch {path.parent / 'PWNED'}",))

        torch.save({"step": 1, "x": Evil()}, path)
    elif kind == "foreign":
        torch.save({"step": 10, "weights": torch.zeros(3)}, path)


@pytest.mark.parametrize("kind, fragment", [
    ("truncated", "truncated or corrupted"), ("empty", "truncated or corrupted"), ("random", "truncated or corrupted"),
    ("flipped", "fails its checksum"), ("malicious", "could run code"), ("foreign", "does not fit this run's config"),
])
def test4_a_broken_checkpoint_is_one_line_and_nothing_changes(rl_run, capsys, kind, fragment):
    _damage(kind, rl_run / CHECKPOINT)
    before = snapshot(rl_run)
    assert T("--resume", rl_run, "total_steps=200") == 2
    one_error(capsys, str(rl_run / CHECKPOINT), fragment, "nothing was changed")
    assert snapshot(rl_run) == before and not (rl_run / "checkpoints" / "PWNED").exists()


@pytest.mark.parametrize("kind", ["truncated", "malicious"])
def test4_diagnose_and_continual_report_a_broken_checkpoint_in_one_line(rl_run, cl_run, capsys, kind):
    _damage(kind, rl_run / CHECKPOINT)
    assert D(rl_run) == 2
    one_error(capsys, str(rl_run / CHECKPOINT))
    _damage(kind, cl_run / CHECKPOINT)
    assert C("--resume", cl_run, "stream.num_tasks=3") == 2
    one_error(capsys, str(cl_run / CHECKPOINT))


# ----------------------------------------------------------------------------- 5: binary --config
@pytest.mark.parametrize("tool", [T, C])
def test5_a_binary_config_file_is_one_line(tmp_path, capsys, tool):
    f = tmp_path / "binary.yaml"
    f.write_bytes(bytes(range(256)))
    assert tool("--config", f, f"run_dir={tmp_path / 'rd'}") == 2
    one_error(capsys, str(f), "not a text (UTF-8) file")
    assert not (tmp_path / "rd").exists()


# ----------------------------------------------------------------------------- 6, 7: values and seeds
@pytest.mark.parametrize("tool, override, fragment", [
    (T, "critic.lr=inf", "critic.lr: must be a finite number"), (T, "alpha.init=inf", "alpha.init: must be a finite"),
    (T, "alpha.lr=.inf", "alpha.lr: must be a finite"), (T, "actor.log_std_max=inf",
                                                         "actor.log_std_max: must be a finite"),
    (T, "alpha.target_entropy_scale=nan", "target_entropy_scale: must be a finite"),
    (T, "replay_ratio=inf", "replay_ratio: must be a finite"), (T, "replay_ratio=1e400",
                                                                "replay_ratio: must be a finite"),
    (T, "critic.regularizers=[{name: spectral, coef: .nan}]", "coef: must be a finite"),
    (C, "optimizer.lr=inf", "optimizer.lr: must be a finite"), (C, "optimizer.eps=nan",
                                                                "optimizer.eps: must be a finite"),
    (C, "optimizer.eps=-1", "optimizer.eps: must be >= 0"),
    (T, "seed=-1", "seed: seeds must lie in [0, 2147483647]"), (T, "seed=1e20", "seed: seeds must lie in"),
    (C, "seed=-1", "seed: must lie in [0, "), (C, "seed=1e20", "seed: must lie in"),
])
def test6_7_non_finite_values_and_seeds_out_of_range_are_refused_up_front(tmp_path, capsys, tool, override, fragment):
    assert tool(*(RL if tool is T else CL), override, f"run_dir={tmp_path / 'rd'}") == 2
    one_error(capsys, fragment)
    assert not (tmp_path / "rd").exists()


def test7_the_largest_seed_is_accepted_and_one_more_seed_is_not(tmp_path, capsys):
    assert T(*RL, "total_steps=60", "seed=2147483647", f"run_dir={tmp_path / 'a'}") == 0
    assert T(*RL, "total_steps=60", "seed=2147483647", "num_seeds=2", f"run_dir={tmp_path / 'b'}") == 2
    one_error(capsys, "num_seeds=2")


# ----------------------------------------------------------------------------- 8: memory
@pytest.mark.parametrize("tool, overrides", [
    (T, ["buffer_size=1000000000000"]), (T, ["batch_size=100000000"]), (T, ["critic.hidden=[100000, 100000]"]),
    (C, ["batch_size=100000000"]), (C, ["model.width=1000000"]),
    (C, ["dataset.name=synthetic", "dataset.synthetic.dim=1000000000"]),
])
def test8_impossible_sizes_are_refused_with_the_estimate_before_the_run_dir(tmp_path, capsys, tool, overrides):
    assert tool(*(RL if tool is T else CL), *overrides, f"run_dir={tmp_path / 'rd'}") == 2
    one_error(capsys, "not enough memory: this config needs at least", "is available on cpu; reduce")
    assert not (tmp_path / "rd").exists()


def test8_estimates_match_the_allocations_they_count():
    from sac_spectral.agents import SAC, TD3, ReplayBuffer
    from sac_spectral.core.seeding import SeedStreams

    cfg = train.TrainConfig(num_seeds=2, buffer_size=300, batch_size=8)
    cfg.critic.hidden, cfg.actor.hidden, cfg.diagnostics.every = [16, 8], [12], 0
    cfg.critic.regularizers, cfg.actor.regularizers = [{"name": "l2_init"}], []
    agent = SAC(5, 2, cfg, SeedStreams([0, 1]))
    buffer = ReplayBuffer(cfg.buffer_size, 5, 2, 2)
    parts = SAC.memory_estimate(cfg, 5, 2)
    assert parts["replay buffer"] == sum(t.numel() * t.element_size() for t in buffer.storage.values())
    actor = sum(p.numel() for p in agent.actor.parameters())
    critic = sum(p.numel() for p in agent.critic.parameters())
    assert parts["networks and Adam state"] == 4 * (4 * actor + (4 + 1 + 1) * critic)  # + target, + θ₀ of l2_init
    cfg.critic.layer_norm = cfg.actor.layer_norm = True  # the networks as built: LayerNorm's gains and shifts count too
    agent = SAC(5, 2, cfg, SeedStreams([0, 1]))
    actor = sum(p.numel() for p in agent.actor.parameters())
    critic = sum(p.numel() for p in agent.critic.parameters())
    assert SAC.memory_estimate(cfg, 5, 2)["networks and Adam state"] == 4 * (4 * actor + (4 + 1 + 1) * critic)
    agent = TD3(5, 2, cfg, SeedStreams([0, 1]))  # its target actor counts too
    actor = sum(p.numel() for p in agent.actor.parameters())
    assert TD3.memory_estimate(cfg, 5, 2)["networks and Adam state"] == 4 * ((4 + 1) * actor + (4 + 1 + 1) * critic)
    from sac_spectral.supervised.models import build_model

    for name, shape in [("mlp", (1, 8, 8)), ("cnn", (3, 16, 16)), ("vit", (3, 16, 16)), ("resnet18", (3, 16, 16))]:
        params, acts = sizes.model_size(lambda name=name, shape=shape: build_model(name, shape, 10, 16, 2), shape)
        assert params == sum(p.numel() for p in build_model(name, shape, 10, 16, 2).parameters())
        assert acts > 0


def test8_check_fits_compares_with_the_available_memory(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000)
    memory.check_fits({"a": 600, "b": 400}, "cpu", "x")
    with pytest.raises(ConfigError, match=r"needs at least 1001 B \(b 601 B, a 400 B\) but 1000 B is available"):
        memory.check_fits({"a": 400, "b": 601}, "cpu", "x")
    assert memory.available_bytes("cpu") > 0


# ----------------------------------------------------------------------------- 9: unwritable paths
def _unwritable(tmp_path: Path) -> Path:
    """A directory nothing can be created in (chmod does not stop root: use a path under a file)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    return blocker / "sub"


def test9_an_unwritable_run_dir_is_one_line_and_creates_nothing(tmp_path, capsys):
    assert T(*RL, "total_steps=60", f"run_dir={_unwritable(tmp_path) / 'run'}") == 2
    one_error(capsys, "cannot be created: Not a directory")
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        assert C(*CL, f"run_dir={ro / 'run'}") == 2
        one_error(capsys, "run_dir")
        assert list(ro.iterdir()) == []


def test9_diagnose_checks_its_output_paths_before_working(rl_run, tmp_path, capsys):
    assert D(rl_run, "--json", _unwritable(tmp_path) / "values.json") == 2
    one_error(capsys, "--json", "does not exist (or is not a directory)")
    assert D(rl_run, "--plot", tmp_path) == 2
    one_error(capsys, "--plot", "is a directory")


# ----------------------------------------------------------------------------- 10: disk full
def _disk_fills_after(monkeypatch: pytest.MonkeyPatch, nbytes: int) -> None:
    """Every file the run opens for an atomic write fails with ENOSPC after ``nbytes`` bytes."""
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f, self.left = f, nbytes

        def write(self, data):
            if len(data) > self.left:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.left -= len(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(checkpoint.os, "fdopen", lambda fd, mode="r": Full(real_fdopen(fd, mode)))


def test10_disk_full_while_checkpointing_keeps_the_last_checkpoint(rl_run, monkeypatch, capsys):
    good = (rl_run / CHECKPOINT).read_bytes()
    capsys.readouterr()
    _disk_fills_after(monkeypatch, 50_000)  # config.yaml fits, the checkpoint does not
    assert T("--resume", rl_run, "total_steps=200") == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: disk full (No space left on device) writing") and "latest.pt at step 200" in err
    assert f"last good checkpoint is kept at {rl_run / CHECKPOINT}" in err and f"--resume {rl_run}" in err
    assert (rl_run / CHECKPOINT).read_bytes() == good
    assert rundir.stale_temp_files(rl_run) == []
    monkeypatch.undo()
    assert T("--resume", rl_run, "total_steps=200") == 0


def test10_disk_full_when_the_run_starts_leaves_nothing(tmp_path, monkeypatch, capsys):
    _disk_fills_after(monkeypatch, 10)
    assert C(*CL, f"run_dir={tmp_path / 'new' / 'run'}") == 1
    one_error(capsys, "disk full", "config.yaml")
    assert not (tmp_path / "new").exists()


# ----------------------------------------------------------------------------- 11: divergence and diagnostics
def test11_divergence_within_a_task_stops_before_the_diagnostics(tmp_path, capsys):
    rd = tmp_path / "run"
    assert C(*CL, "gradient_diagnostics=true", "stream.iters_per_task=50", "log_every=100", "optimizer.lr=1e10",
             f"run_dir={rd}") == 1
    one_error(capsys, "non-finite", "iteration 50")


def test11_a_failing_diagnostic_logs_nan_and_warns_once(capsys):
    calls = []

    def flaky(probe):
        calls.append(probe.iteration)
        if len(calls) > 1:
            raise torch.linalg.LinAlgError("svd failed to converge")
        return {"x/a": 1.0}

    model = torch.nn.Linear(3, 2)
    learner = ContinualLearner(model, "classification", make_optimizer("sgd", model.parameters(), 0.1), (), (flaky,))
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    assert learner.diagnose(x, y, 0, 1, True) == {"x/a": 1.0}
    assert learner.diagnose(x, y, 0, 2, True)["x/a"] != learner.diagnose(x, y, 0, 3, True)["x/a"]  # NaN ≠ NaN
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "flaky failed at iteration 2 (LinAlgError" in warnings[0]


# ----------------------------------------------------------------------------- 12: corrupt datasets
def _idx(shape, code=0x08, fill=1):
    return bytes([0, 0, code, len(shape)]) + struct.pack(f">{len(shape)}i", *shape) + bytes([fill]) * int(
        torch.tensor(shape).prod())


def _mnist(root: Path, train_labels: int = 20) -> Path:
    d = root / "mnist"
    d.mkdir(parents=True)
    (d / "train-images-idx3-ubyte").write_bytes(_idx([20, 4, 4]))
    (d / "train-labels-idx1-ubyte").write_bytes(_idx([train_labels]))
    (d / "t10k-images-idx3-ubyte").write_bytes(_idx([5, 4, 4]))
    (d / "t10k-labels-idx1-ubyte").write_bytes(_idx([5]))
    return d


@pytest.mark.parametrize("damage, fragment", [
    (lambda d: (d / "train-images-idx3-ubyte").write_bytes(bytes([0, 0, 8, 3, 0, 0])),
     "train-images-idx3-ubyte: truncated IDX header"),
    (lambda d: ((d / "train-labels-idx1-ubyte").unlink(),
                (d / "train-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8bgarbage")),
     "train-labels-idx1-ubyte.gz: not a readable gzip file"),
    (lambda d: (d / "train-labels-idx1-ubyte").write_bytes(_idx([10])),
     "[20, 4, 4] images and train-labels-idx1-ubyte [10] labels"),
    (lambda d: (d / "train-labels-idx1-ubyte").write_bytes(_idx([20], 0x09, 0xFF)), "negative label (-1)"),
])
def test12_corrupt_dataset_files_are_one_line_naming_the_file(tmp_path, capsys, damage, fragment):
    damage(_mnist(tmp_path))
    with pytest.raises(DataError, match=r".*") as info:
        load_dataset("mnist", tmp_path)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert C(*CL, "dataset.name=mnist", f"dataset.data_dir={tmp_path}", f"run_dir={tmp_path / 'rd'}") == 2
    one_error(capsys, fragment)
    assert not (tmp_path / "rd").exists()


def test12_damaged_cifar_and_svhn_files_name_the_file(tmp_path):
    c = tmp_path / "cifar-10-batches-py"
    c.mkdir()
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (c / name).write_bytes(b"\x80\x04\x95garbage")
    with pytest.raises(DataError, match="data_batch_1: not a readable CIFAR python batch"):
        load_dataset("cifar10", tmp_path)
    s = tmp_path / "svhn"
    s.mkdir()
    for name in ("train_32x32.mat", "test_32x32.mat"):
        (s / name).write_bytes(b"MATLAB 5.0 MAT-file" + bytes(100))
    with pytest.raises(DataError, match="train_32x32.mat: not a readable MATLAB file"):
        load_dataset("svhn", tmp_path)


# ----------------------------------------------------------------------------- 13: diagnose options
@pytest.mark.parametrize("option, fragment", [
    (["--threads", "-1"], "--threads: -1 is out of range; valid: 1 to"),
    (["--threads", "0"], "--threads: 0 is out of range"),
    (["--tau", "nan"], "--tau: must be a finite number"), (["--batch-size", "1"], "--batch-size: must be >= 2"),
])
def test13_bad_diagnose_options_are_one_line(rl_run, capsys, option, fragment):
    assert D(rl_run, *option) == 2
    one_error(capsys, fragment)


# ----------------------------------------------------------------------------- 14: every regularizer, continual
SPECS = {
    "l2": {"coef": 1e-3}, "l2_init": {"coef": 1e-3}, "wasserstein_init": {"coef": 1e-3}, "parseval": {"coef": 1e-3},
    "spectral": {"coef": 1e-3}, "spectral_norm": {}, "shrink_perturb": {"shrink": 0.1, "sigma": 0.01, "every": 7},
    "redo": {"tau": 0.5, "every": 11}, "reset": {"every": 13, "last": 1},
    "plasticity_injection": {"at_step": 25}, "nap": {}, "cbp": {"replacement_rate": 0.05, "maturity_threshold": 5},
}


def test14_the_spec_table_covers_every_registered_regularizer():
    assert set(SPECS) == set(REGISTRY)


@pytest.mark.parametrize("name", sorted(SPECS))
def test14_every_regularizer_runs_and_resumes_in_the_continual_runner(tmp_path, name):
    spec = "[" + yaml.safe_dump({"name": name, **SPECS[name]}, default_flow_style=True).strip() + "]"
    rd = tmp_path / "run"
    norm = ["model.norm=layer"] if name == "nap" else []  # NaP needs normalization layers
    assert C(*CL, *norm, "stream.num_tasks=1", f"regularizers={spec}", f"run_dir={rd}") == 0
    assert C("--resume", rd, "stream.num_tasks=2") == 0
    reg_state = load_checkpoint(rd / CHECKPOINT)["learner"]["regularizers"][0]
    if name == "redo":  # the probe is the training batch, and units were recycled
        assert float(reg_state["recycled"].sum()) > 0
    if name == "reset":
        assert float(reg_state["resets"].sum()) == 40 // 13
    if name == "plasticity_injection":  # injected after the resume
        assert float(reg_state["injected"]) == 1.0
    if name == "cbp":
        assert float(reg_state["replaced"].sum()) > 0


# ----------------------------------------------------------------------------- 15, 16: unstarted runs, temp files
def _unstarted(finished_run: Path, tmp_path: Path) -> Path:
    """What kill -9 before the first checkpoint leaves: config.yaml, events, a half-written temp file."""
    rd = tmp_path / "unstarted"
    (rd / "checkpoints").mkdir(parents=True)
    shutil.copy(finished_run / "config.yaml", rd / "config.yaml")
    (rd / "events.out.tfevents.1.host.1.0").write_bytes(b"events of the killed attempt")
    (rd / "checkpoints" / ".latest.pt.abc123.tmp").write_bytes(b"half a checkpoint")
    return rd


def test15_resume_restarts_a_run_killed_before_its_first_checkpoint(finished, tmp_path, capsys):
    rd = _unstarted(finished["rl"], tmp_path)
    assert T("--resume", rd, "total_steps=120") == 0
    assert "has no checkpoint (its run stopped before the first one); starting it afresh" in capsys.readouterr().err
    assert load_checkpoint(rd / CHECKPOINT)["step"] == 120
    assert not (rd / "events.out.tfevents.1.host.1.0").exists() and rundir.stale_temp_files(rd) == []


def test15_a_fresh_run_may_reuse_an_unstarted_run_dir_but_not_a_started_one(finished, rl_run, tmp_path, capsys):
    rd = _unstarted(finished["cl"], tmp_path)
    assert C(*CL, f"run_dir={rd}") == 0
    assert "held a run stopped before its first checkpoint" in capsys.readouterr().err
    (rl_run / "summary.json").unlink()  # a checkpoint without a summary: a stopped run, to be resumed
    assert T(*RL, f"run_dir={rl_run}") == 2
    one_error(capsys, "holds a run; resume it with --resume")
    (rl_run / "notes.txt").write_text("mine")
    (rl_run / CHECKPOINT).unlink()
    assert T(*RL, f"run_dir={rl_run}") == 2
    one_error(capsys, "holds other files")


def test15_a_hand_written_config_yaml_is_not_taken_for_an_unstarted_run(tmp_path, capsys):
    rd = tmp_path / "exp"
    rd.mkdir()
    (rd / "config.yaml").write_text("# my notes\ntotal_steps: 60\n")
    before = snapshot(rd)
    assert T("--config", rd / "config.yaml", *RL, f"run_dir={rd}") == 2
    one_error(capsys, "holds other files")
    assert T("--resume", rd) == 2
    one_error(capsys, "latest.pt is missing")
    assert snapshot(rd) == before


def test16_stale_temp_files_are_removed_on_resume(rl_run):
    stale = [rl_run / "checkpoints" / ".latest.pt.k1ll3d.tmp", rl_run / ".summary.json.x1.tmp"]
    for p in stale:
        p.write_bytes(b"half")
    (rl_run / "checkpoints" / "keep.tmp").write_bytes(b"not ours")
    assert T("--resume", rl_run, "total_steps=160") == 0
    assert not any(p.exists() for p in stale) and (rl_run / "checkpoints" / "keep.tmp").exists()


# ----------------------------------------------------------------------------- 17: overrides anywhere
def test17_split_overrides_skips_option_values():
    args = ["a=1", "--config", "x=y.yaml", "--methods", "none", "b.c=2", "--seeds", "0", "--out=o", "d=[1, 2]", "pos"]
    assert cli.split_overrides(args, ("--config",)) == (
        ["a=1", "b.c=2", "d=[1, 2]"], ["--config", "x=y.yaml", "--methods", "none", "--seeds", "0", "--out=o", "pos"])


def test17_overrides_before_and_after_config_and_resume(rl_run, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("total_steps: 60\nseed: 3\n")
    rd = tmp_path / "run"
    assert T("seed=5", *RL[:4], "--config", cfg, *RL[4:], f"run_dir={rd}") == 0
    saved = read_yaml(rd / "config.yaml")
    assert saved["total_steps"] == 60 and saved["seed"] == 5 and saved["env"] == "dmc:cartpole-balance"
    assert C("seed=1", "--config", ROOT / "run_configs" / "continual_default.yaml", *CL,
             f"run_dir={tmp_path / 'c'}") == 0
    assert T("total_steps=160", "--resume", rl_run) == 0


def test17_sweep_takes_overrides_between_options(tmp_path, capsys):
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"kind: continual\nbase: {{config: {ROOT / 'run_configs' / 'continual_default.yaml'}}}\n"
                   "methods: {none: {}}\nseeds: [0]\n")
    argv = ["seeds=[0, 1]", "--config", str(cfg), "--dry-run", "base.stream.num_tasks=1", "--out", str(tmp_path / "o")]
    assert run_cli(sweep.main, argv) == 0
    out = capsys.readouterr().out
    assert "none/s0" in out and "none/s1" in out
    assert not (tmp_path / "o").exists()  # a dry run writes nothing


# ----------------------------------------------------------------------------- 18: messages
def test18_run_dir_file_empty_and_config_directory_messages(tmp_path, monkeypatch, capsys):
    f = tmp_path / "a_file"
    f.write_text("keep")
    assert T(*RL, f"run_dir={f}") == 2
    one_error(capsys, "is a file, not a directory")
    assert f.read_text() == "keep"
    cwd = tmp_path / "empty_cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for tool, base in ((T, RL), (C, CL)):
        assert tool(*base, "run_dir=") == 2
        one_error(capsys, "run_dir: empty")
    assert list(cwd.iterdir()) == []
    assert T("--config", tmp_path) == 2
    one_error(capsys, "is a directory, not a YAML file")


def test18_duplicate_yaml_keys_are_refused(tmp_path, capsys):
    f = tmp_path / "dup.yaml"
    f.write_text("total_steps: 100\ncritic:\n  lr: 1\n  lr: 2\n")
    assert T("--config", f) == 2
    one_error(capsys, "duplicate key 'lr' (line 4)")


def test18_diagnose_names_a_continual_run(finished, capsys):
    assert D(finished["cl"]) == 2
    one_error(capsys, "is a run of python -m sac_spectral.continual")


# ----------------------------------------------------------------------------- guarantees underneath
def test_a_run_dir_in_use_by_another_process_is_refused(rl_run, capsys):
    fd = os.open(rl_run, os.O_RDONLY)  # another process's lock, as far as flock is concerned
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        before = snapshot(rl_run)
        assert T("--resume", rl_run, "total_steps=200") == 2
        one_error(capsys, "is in use by another process")
        assert snapshot(rl_run) == before
    finally:
        os.close(fd)


def test_a_second_interrupt_aborts_with_one_line_and_exit_130(capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    assert run_cli(interrupted, []) == 130
    one_error(capsys, "interrupted before a checkpoint could be written")


def test_checkpoint_errors_are_one_line_config_errors(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory"):
        load_checkpoint(tmp_path)
    assert issubclass(CheckpointError, ConfigError)


# ---------------------------------------------------------------- issue 29: runs stopped early, finished, untrained
def _kill_after_two_evaluations(rd: Path) -> None:
    """kill -9 a run (the real CLI) once evals.csv holds two evaluations and before any checkpoint,
    as a crash between the default first evaluation (10 k) and first checkpoint (25 k) does."""
    cmd = [sys.executable, "-m", "sac_spectral.train", *RL, "total_steps=100000", "checkpoint_every=0", "eval_every=25",
           f"run_dir={rd}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while proc.poll() is None and len(read_evals(rd)) < 2:
            time.sleep(0.05)
    finally:
        proc.kill()
        err = proc.communicate()[1]
    assert len(read_evals(rd)) >= 2 and not (rd / CHECKPOINT).exists(), err


def _steps(rd: Path) -> list[int]:
    return [int(row["step"]) for row in read_evals(rd)]


def test29_1_a_run_killed_after_an_evaluation_restarts_without_its_stale_evaluations(tmp_path, capsys):
    rd, again = tmp_path / "killed", tmp_path / "killed_again"
    _kill_after_two_evaluations(rd)
    shutil.copytree(rd, again)
    old_events = {p.name for p in rd.glob("events.out.tfevents.*")}
    assert T("--resume", rd, "total_steps=120", "eval_every=60") == 0
    assert "starting it afresh from its config.yaml" in capsys.readouterr().err
    assert _steps(rd) == [60, 120] and load_checkpoint(rd / CHECKPOINT)["step"] == 120
    assert not old_events & {p.name for p in rd.glob("events.out.tfevents.*")}
    assert T(*RL, "total_steps=100", "eval_every=50", f"run_dir={again}") == 0
    assert "held a run stopped before its first checkpoint" in capsys.readouterr().err
    assert _steps(again) == [50, 100]


def test29_1_one_definition_of_what_a_run_writes_before_its_first_checkpoint(finished, tmp_path):
    """Runs and sweeps agree: config, events, evals.csv, videos and temporary files, nothing else."""
    rd = _unstarted(finished["rl"], tmp_path)
    (rd / "evals.csv").write_text("step,seed,updates,return,episodes,wall_time_s\n25,0,0,1.5,1,0.1\n")
    (rd / ".evals.csv.tmp").write_text("")
    (rd / "videos").mkdir()
    for name in ("step_00000025.mp4", "step_00000025.gif", ".step_00000050.mp4.x1y2.mp4", ".step_00000050.gif.x1.tmp"):
        (rd / "videos" / name).write_bytes(b"frames")
    assert trial.written_by_a_run is layout.written_by_a_run
    assert layout.written_by_a_run(rd) and rundir.is_unstarted_run_dir(rd, train.TrainConfig)
    (rd / "videos" / "mine.mp4").write_bytes(b"my video")
    assert not layout.written_by_a_run(rd) and not rundir.is_unstarted_run_dir(rd, train.TrainConfig)
    (rd / "videos" / "mine.mp4").unlink()
    assert T("--resume", rd, "total_steps=60") == 0
    assert not (rd / "videos").exists() and _steps(rd) == [60] and not (rd / ".evals.csv.tmp").exists()


@pytest.mark.parametrize("cxx", ["/nonexistent/g++", ""], ids=["missing", "empty"])
def test29_2_compile_without_a_compiler_runs_eager_and_says_so_in_one_line(tmp_path, cxx):
    rd = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "sac_spectral.train", *RL, "compile=true", "total_steps=60",
                           f"run_dir={rd}"],
                          cwd=ROOT, env={**os.environ, "CXX": cxx}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "compile" in line and not line.startswith(START_LINES)]
    assert len(notes) == 1 and notes[0].startswith("warning: compile=true needs a C++ compiler (none found: "), notes
    assert notes[0].endswith("; running eager")
    summary = json.loads((rd / SUMMARY).read_text())
    assert summary["updates"] == 10 and summary["warnings"] == [notes[0].removeprefix("warning: ")]
    assert read_yaml(rd / "config.yaml")["compile"] is False


def test29_2_a_working_compiler_is_found():
    if shutil.which(os.environ.get("CXX") or "g++") is None:
        pytest.skip("no C++ compiler on this machine")
    assert missing_compiler() is None


def test29_3_compile_may_change_on_resume(tmp_path):
    if missing_compiler() is not None:
        pytest.skip("no C++ compiler: compile=true runs eager")
    rd = tmp_path / "run"
    assert T(*RL, "compile=true", "total_steps=50", f"run_dir={rd}") == 0  # warm-up only: nothing compiled yet
    assert load_checkpoint(rd / CHECKPOINT)["config"]["compile"] is True
    assert T("--resume", rd, "compile=false", "total_steps=70") == 0
    state = load_checkpoint(rd / CHECKPOINT)
    assert state["config"]["compile"] is False and state["agent"]["num_updates"] == 20
    assert read_yaml(rd / "config.yaml")["compile"] is False


def test29_4_resume_of_a_finished_run_says_so_and_changes_nothing(rl_run, capsys):
    def stamps() -> dict[Path, tuple[int, int]]:
        return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in [rl_run, *rl_run.rglob("*")]}

    before, contents = stamps(), snapshot(rl_run)
    final = json.loads((rl_run / SUMMARY).read_text())["final_eval_return"]
    for extra in ([], ["total_steps=150", "progress=true", "eval_episodes=3"]):
        assert T("--resume", rl_run, *extra) == 0
        out = capsys.readouterr()
        lines = (out.out + out.err).strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{rl_run} is finished at step 150 of 150"), lines
        assert f"final eval return {final:.1f}" in lines[0] and "total_steps=" in lines[0]
        assert stamps() == before and snapshot(rl_run) == contents
    assert T("--resume", rl_run, "total_steps=160") == 0  # a larger total_steps extends it, as before
    assert json.loads((rl_run / SUMMARY).read_text())["steps"] == 160


def test29_5_a_run_that_does_no_update_says_so_at_start_and_in_its_summary(tmp_path, capsys):
    rd = tmp_path / "run"
    assert T(*RL, "total_steps=40", "eval_every=20", f"run_dir={rd}") == 0  # random_steps=50
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert warnings == ["warning: total_steps=40 <= random_steps=50: this run does 0 updates (only random warm-up); "
                        "lower random_steps to train"]
    summary = json.loads((rd / SUMMARY).read_text())
    assert summary["updates"] == 0 and summary["warnings"] == [warnings[0].removeprefix("warning: ")]
    assert summary["best_eval_return"] is None and summary["per_seed"][0]["best_eval_return"] is None
    assert summary["final_eval_return"] == summary["eval_history"][-1]["returns"][0]


def test29_6_a_step_is_an_agent_step_and_simulator_steps_are_named_so(tmp_path, capsys):
    rd = tmp_path / "run"
    assert T(*RL, "action_repeat=4", "total_steps=60", f"run_dir={rd}") == 0
    assert "60 steps (240 simulator steps at action_repeat 4)" in capsys.readouterr().err
    summary = json.loads((rd / SUMMARY).read_text())
    assert summary["steps"] == 60 and summary["simulator_steps"] == 240
    assert "steps_per_s" in summary and "env_steps_per_s" not in summary
