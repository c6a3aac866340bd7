"""Bad inputs for the three command-line tools: each attack runs ``python -m sac_spectral.train |
continual | diagnose`` as subprocesses on tiny configs in a scratch workspace (see
``tests/attacks.py``): kill -9 at random moments and during checkpoint writes, signals, corrupted /
truncated / malicious / foreign checkpoints, hand-edited run directories, malformed and extreme
inputs, unwritable paths, a full disk (a file-size limit, ``RLIMIT_FSIZE``), forced divergence and
corrupt dataset files. One test per attack. The whole suite (about 9 of the full run's 12 minutes
on 2 cores) is marked slow: ``-m 'not slow'`` leaves it out.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import random
import shutil
import signal
import stat
import struct
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
import yaml

from attacks import (
    AS_ROOT,
    CKPT,
    CL,
    RL,
    Attack,
    Ctx,
    Proc,
    checkpoint_sound,
    expect_error,
    expect_ok,
    snapshot,
    temp_files,
    traceback_in,
    unchanged,
    unwritable_dir,
)

pytestmark = pytest.mark.slow
ATTACKS: list[Attack] = []


def register(name: str, fn: Callable[[Ctx], list[str]]) -> None:
    """Add an attack; a repeated name gets a numeric suffix."""
    taken = {a.name for a in ATTACKS}
    unique, i = name, 2
    while unique in taken:
        unique, i = f"{name}_{i}", i + 1
    ATTACKS.append(Attack(unique, fn))


def attack() -> Callable[[Callable[[Ctx], list[str]]], Callable[[Ctx], list[str]]]:
    """Register the decorated function as an attack named after it."""
    def wrap(fn: Callable[[Ctx], list[str]]) -> Callable[[Ctx], list[str]]:
        register(fn.__name__, fn)
        return fn

    return wrap


@attack()
def optimizer_state_overflow_rl(ctx: Ctx) -> list[str]:
    rd = ctx.path("adam_inf")
    p = ctx.T(*RL, "total_steps=600", "checkpoint_every=100", "critic.lr=1e3", "actor.lr=1e3", f"run_dir={rd}")
    problems = expect_error(p, 1, "non-finite")
    if (rd / CKPT).exists():
        problems += checkpoint_sound(rd / CKPT)[0]
    return problems


@attack()
def optimizer_state_overflow_continual(ctx: Ctx) -> list[str]:
    rd = ctx.path("adam_inf_cl")
    p = ctx.C(*CL, "stream.num_tasks=4", "optimizer.lr=1e30", "regularizers=[]", "gradient_diagnostics=false",
              f"run_dir={rd}")
    problems = expect_error(p, 1, "non-finite")
    if (rd / CKPT).exists():
        problems += checkpoint_sound(rd / CKPT)[0]
    return problems


def _edit_config(rd: Path, key: str, value: object) -> None:
    data = yaml.safe_load((rd / "config.yaml").read_text())
    node = data
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    (rd / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


@attack()
def edited_replay_ratio_on_resume(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "edit_rr")
    _edit_config(rd, "replay_ratio", 4.0)
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "total_steps=200"), 2, "replay_ratio") + unchanged(before, rd)


@attack()
def edited_env_on_resume(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "edit_env")
    _edit_config(rd, "env", "dmc:cheetah-run")
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "total_steps=200"), 2, "env") + unchanged(before, rd)


@attack()
def edited_hidden_on_resume(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "edit_hidden")
    _edit_config(rd, "critic.hidden", [64, 64])
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "total_steps=200"), 2, "critic.hidden") + unchanged(before, rd)


@attack()
def edited_seed_on_resume(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "edit_seed")
    _edit_config(rd, "seed", 7)
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "total_steps=200"), 2, "seed") + unchanged(before, rd)


@attack()
def edited_model_width_on_continual_resume(ctx: Ctx) -> list[str]:
    rd = ctx.copy("RC", "edit_width")
    _edit_config(rd, "optimizer.lr", 0.5)
    before = snapshot(rd)
    return expect_error(ctx.C("--resume", rd, "stream.num_tasks=3"), 2, "optimizer.lr") + unchanged(before, rd)


@attack()
def foreign_checkpoint_of_another_config(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "foreign_ckpt")
    shutil.copy(ctx.fixture("R_wide") / CKPT, rd / CKPT)
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "total_steps=200"), 2, "hidden") + unchanged(before, rd)


@attack()
def resume_total_steps_below_step(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "steps_below")
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "total_steps=100"), 2, "total_steps") + unchanged(before, rd)


@attack()
def resume_num_tasks_below_done(ctx: Ctx) -> list[str]:
    rd = ctx.copy("RC", "tasks_below")
    before = snapshot(rd)
    return expect_error(ctx.C("--resume", rd, "stream.num_tasks=1"), 2, "num_tasks") + unchanged(before, rd)


def _corrupt(kind: str, path: Path, ctx: Ctx) -> None:
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(random.Random(0).randbytes(len(data)))
    elif kind in ("flipped_tensor_bytes", "flipped_header_bytes"):
        with zipfile.ZipFile(path) as z:
            records = [i for i in z.infolist() if ("/data/" in i.filename) == (kind == "flipped_tensor_bytes")]
        rec = max(records, key=lambda i: i.file_size)
        name_len, extra_len = struct.unpack("<HH", data[rec.header_offset + 26 : rec.header_offset + 30])
        start = rec.header_offset + 30 + (name_len + extra_len if kind == "flipped_tensor_bytes" else 0)
        b = bytearray(data)
        for i in range(start, start + 8):
            b[i] ^= 0xFF
        path.write_bytes(bytes(b))
    elif kind == "malicious":
        marker = path.parent / "PWNED"

        class Evil:
            def __reduce__(self) -> tuple:
                return (os.system, (f"touch {marker}",))

        torch.save({"step": 1, "x": Evil()}, path)
    elif kind == "plain_pickle":
        path.write_bytes(pickle.dumps({"step": 1}))
    elif kind == "wrong_structure":
        torch.save({"step": 10, "weights": torch.zeros(3)}, path)
    elif kind == "zip_garbage":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("archive/data.pkl", b"not a pickle")
    elif kind == "directory":
        path.unlink()
        path.mkdir()


CORRUPTIONS = ("truncated", "empty", "random", "flipped_tensor_bytes", "flipped_header_bytes", "malicious",
               "plain_pickle", "wrong_structure", "zip_garbage",
               "directory")


def _corrupt_attack(kind: str, tool: str) -> Callable[[Ctx], list[str]]:
    def fn(ctx: Ctx) -> list[str]:
        rd = ctx.copy("RC" if tool == "continual" else "R", f"corrupt_{kind}_{tool}")
        _corrupt(kind, rd / CKPT, ctx)
        before = snapshot(rd)
        if tool == "train":
            p = ctx.T("--resume", rd, "total_steps=200")
        elif tool == "continual":
            p = ctx.C("--resume", rd, "stream.num_tasks=3")
        else:
            p = ctx.D(rd)
        problems = expect_error(p, 2, "latest.pt") + unchanged(before, rd)
        if (rd / "checkpoints" / "PWNED").exists():
            problems.append("the malicious checkpoint ran code")
        return problems

    fn.__name__ = f"checkpoint_{kind}_{tool}"
    return fn


for _kind in CORRUPTIONS:
    for _tool in ("train", "diagnose"):
        attack()(_corrupt_attack(_kind, _tool))
for _kind in ("truncated", "random", "malicious"):
    attack()(_corrupt_attack(_kind, "continual"))


@attack()
def binary_config_file_train(ctx: Ctx) -> list[str]:
    f = ctx.path("binary.yaml")
    f.write_bytes(bytes(range(256)) * 4)
    rd = ctx.path("binary_rd")
    return expect_error(ctx.T("--config", f, f"run_dir={rd}"), 2,
                        str(f.name)) + (["run dir written"] if rd.exists() else [])


@attack()
def binary_config_file_continual(ctx: Ctx) -> list[str]:
    f = ctx.path("binary.yaml")
    f.write_bytes(b"\xff\xfe\x00\x81" * 100)
    rd = ctx.path("binary_rd")
    return expect_error(ctx.C("--config", f, f"run_dir={rd}"), 2,
                        str(f.name)) + (["run dir written"] if rd.exists() else [])


def _bad_value_attack(tool: str, overrides: Sequence[str], key: str) -> Callable[[Ctx], list[str]]:
    def fn(ctx: Ctx) -> list[str]:
        rd = ctx.path("bad_value")
        base = RL if tool == "train" else CL
        p = (ctx.T if tool == "train" else ctx.C)(*base, "total_steps=150" if tool == "train" else "seed=0",
                                                   *overrides, f"run_dir={rd}")
        return expect_error(p, 2, key) + (["run dir written"] if rd.exists() else [])

    fn.__name__ = f"{tool}_{'_'.join(overrides).replace('=', '_').replace('.', '_')}"
    return fn


for _tool, _override, _key in [
    ("train", "critic.lr=inf", "critic.lr"), ("train", "alpha.init=inf", "alpha.init"),
    ("train", "alpha.lr=inf", "alpha.lr"), ("train", "actor.log_std_max=inf", "log_std_max"),
    ("train", "alpha.target_entropy_scale=nan", "target_entropy_scale"), ("train", "replay_ratio=inf", "replay_ratio"),
    ("train", "gamma=nan", "gamma"), ("train", "tau=nan", "tau"),
    ("train", "critic.regularizers=[{name: spectral, coef: .inf}]", "coef"),
    ("continual", "optimizer.lr=inf", "optimizer.lr"), ("continual", "optimizer.eps=nan", "optimizer.eps"),
    ("continual", "dormant_tau=nan", "dormant_tau"), ("continual", "optimizer.weight_decay=inf", "weight_decay"),
]:
    attack()(_bad_value_attack(_tool, [_override], _key))

for _tool, _override in [("train", "seed=-1"), ("train", "seed=1e20"), ("continual", "seed=-1"),
                         ("continual", "seed=1e20"),
                         ("train", "num_seeds=3 seed=2147483647")]:
    attack()(_bad_value_attack(_tool, _override.split(), "seed"))


def _memory_attack(tool: str, *overrides: str) -> Callable[[Ctx], list[str]]:
    def fn(ctx: Ctx) -> list[str]:
        rd = ctx.path("memory")
        p = (ctx.T(*RL, "total_steps=200", *overrides, f"run_dir={rd}") if tool == "train"
             else ctx.C(*CL, *overrides, f"run_dir={rd}"))
        return expect_error(p, 2, "memory") + (["run dir written"] if rd.exists() else [])

    fn.__name__ = f"memory_{tool}_{'_'.join(o.split('=')[0].replace('.', '_') for o in overrides)}"
    return fn


for _tool, _ovs in [
    ("train", ("buffer_size=1000000000000",)), ("train", ("batch_size=100000000",)),
    ("train", ("critic.hidden=[100000, 100000]",)), ("continual", ("batch_size=100000000",)),
    ("continual", ("model.width=1000000",)),
    ("continual", ("dataset.name=synthetic", "dataset.synthetic.dim=1000000000")),
]:
    attack()(_memory_attack(_tool, *_ovs))


@attack()
def unwritable_run_dir_train(ctx: Ctx) -> list[str]:
    rd = unwritable_dir(ctx, "ro_train")
    return expect_error(ctx.T(*RL, "total_steps=100", f"run_dir={rd}"), 2, "run_dir")


@attack()
def unwritable_run_dir_continual(ctx: Ctx) -> list[str]:
    rd = unwritable_dir(ctx, "ro_cl")
    return expect_error(ctx.C(*CL, f"run_dir={rd}"), 2, "run_dir")


@attack()
def diagnose_json_to_unwritable_path(ctx: Ctx) -> list[str]:
    out = unwritable_dir(ctx, "ro_json") / "values.json"
    return expect_error(ctx.D(ctx.fixture("R"), "--json", out), 2, "values.json")


@attack()
def diagnose_plot_to_unwritable_path(ctx: Ctx) -> list[str]:
    out = unwritable_dir(ctx, "ro_plot") / "plot.png"
    return expect_error(ctx.D(ctx.fixture("R"), "--plot", out), 2, "plot.png")


def _disk_full(tool: str) -> Callable[[Ctx], list[str]]:
    def fn(ctx: Ctx) -> list[str]:
        rd = ctx.copy("RC" if tool == "continual" else "R", f"disk_full_{tool}")
        size = (rd / CKPT).stat().st_size
        good = (rd / CKPT).read_bytes()
        extra = ["stream.num_tasks=4"] if tool == "continual" else ["total_steps=400"]
        p = (ctx.C if tool == "continual" else ctx.T)("--resume", rd, *extra, fsize=size)
        problems = expect_error(p, 1, ("space", "full", "too large"), "--resume")
        if not (rd / CKPT).is_file() or (rd / CKPT).read_bytes() != good:
            problems.append("the last good checkpoint was not kept")
        if temp_files(rd):
            problems.append(f"temporary files left: {[t.name for t in temp_files(rd)]}")
        return problems

    fn.__name__ = f"disk_full_while_checkpointing_{tool}"
    return fn


attack()(_disk_full("train"))
attack()(_disk_full("continual"))


@attack()
def disk_full_at_run_start(ctx: Ctx) -> list[str]:
    rd = ctx.path("disk_full_start")
    p = ctx.T(*RL, "total_steps=200", f"run_dir={rd}", fsize=1)
    return expect_error(p, 1, ("space", "full", "too large"))


@attack()
def continual_diverges_within_a_task(ctx: Ctx) -> list[str]:
    rd = ctx.path("diverge_task")
    p = ctx.C(*CL, "stream.iters_per_task=50", "log_every=100", "optimizer.lr=1e10", f"run_dir={rd}")
    problems = expect_error(p, 1, "non-finite")
    if (rd / "summary.json").exists():
        problems.append("a diverged run wrote a summary")
    return problems


@attack()
def rl_diverges_with_diagnostics_on(ctx: Ctx) -> list[str]:
    rd = ctx.path("diverge_diag")
    p = ctx.T(*RL, "total_steps=400", "log_every=200", "diagnostics.every=20", "diagnostics.batch_size=32",
              "critic.lr=1e12", "actor.lr=1e12", f"run_dir={rd}")
    return expect_error(p, 1, "non-finite")


def _idx(shape: Sequence[int], dtype_code: int = 0x08) -> bytes:
    header = bytes([0, 0, dtype_code, len(shape)]) + struct.pack(f">{len(shape)}i", *shape)
    count = 1
    for s in shape:
        count *= s
    return header + bytes(random.Random(len(shape)).randrange(10) for _ in range(count))


def _mnist_dir(ctx: Ctx, name: str, train_images: int = 100, train_labels: int = 100) -> Path:
    root = ctx.path(name)
    d = root / "mnist"
    d.mkdir(parents=True)
    (d / "train-images-idx3-ubyte").write_bytes(_idx([train_images, 8, 8]))
    (d / "train-labels-idx1-ubyte").write_bytes(_idx([train_labels]))
    (d / "t10k-images-idx3-ubyte").write_bytes(_idx([50, 8, 8]))
    (d / "t10k-labels-idx1-ubyte").write_bytes(_idx([50]))
    return root


def _dataset_attack(name: str, damage: Callable[[Path], None], fragment: str) -> Callable[[Ctx], list[str]]:
    def fn(ctx: Ctx) -> list[str]:
        root = _mnist_dir(ctx, name)
        damage(root / "mnist")
        rd = ctx.path("data_rd")
        p = ctx.C(*CL, "dataset.name=mnist", f"dataset.data_dir={root}", f"run_dir={rd}")
        return expect_error(p, 2, fragment) + (["run dir written"] if rd.exists() else [])

    fn.__name__ = f"dataset_{name}"
    return fn


def _truncate_header(d: Path) -> None:
    (d / "train-images-idx3-ubyte").write_bytes(bytes([0, 0, 8, 3, 0, 0]))


def _bad_gz(d: Path) -> None:
    (d / "train-labels-idx1-ubyte").unlink()
    (d / "train-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate")


def _label_mismatch(d: Path) -> None:
    (d / "train-labels-idx1-ubyte").write_bytes(_idx([50]))


def _negative_labels(d: Path) -> None:
    (d / "train-labels-idx1-ubyte").write_bytes(_idx([100], 0x09)[:-1] + b"\xff")


attack()(_dataset_attack("truncated_idx_header", _truncate_header, "train-images-idx3-ubyte"))
attack()(_dataset_attack("bad_gzip", _bad_gz, "train-labels-idx1-ubyte"))
attack()(_dataset_attack("images_labels_mismatch", _label_mismatch, "label"))
attack()(_dataset_attack("negative_label", _negative_labels, "label"))


@attack()
def diagnose_negative_threads(ctx: Ctx) -> list[str]:
    return expect_error(ctx.D(ctx.fixture("R"), "--threads", "-1"), 2, "threads")


@attack()
def diagnose_nan_tau(ctx: Ctx) -> list[str]:
    return expect_error(ctx.D(ctx.fixture("R"), "--tau", "nan"), 2, "tau")


@attack()
def diagnose_batch_size_one(ctx: Ctx) -> list[str]:
    return expect_error(ctx.D(ctx.fixture("R"), "--batch-size", "1"), 2, "batch")


@attack()
def redo_in_the_continual_runner(ctx: Ctx) -> list[str]:
    rd = ctx.path("redo_cl")
    return expect_ok(ctx.C(*CL, "regularizers=[{name: redo, every: 20, tau: 0.5}]", f"run_dir={rd}"))


@attack()
def every_registered_regularizer_in_the_continual_runner(ctx: Ctx) -> list[str]:
    specs = ("[{name: l2}, {name: l2_init}, {name: wasserstein_init}, {name: parseval}, {name: spectral},"
             " {name: spectral_norm}, {name: shrink_perturb, every: 7}, {name: redo, every: 11, tau: 0.5},"
             " {name: reset, every: 25, last: 1}]")
    rd = ctx.path("every_reg_cl")
    return expect_ok(ctx.C(*CL, f"regularizers={specs}", f"run_dir={rd}"))


def _kill_before_first_checkpoint(ctx: Ctx, rd: Path) -> None:
    p = ctx.popen(["-m", "sac_spectral.train", *RL, "total_steps=100000", "checkpoint_every=100000", f"run_dir={rd}"])
    deadline = time.monotonic() + 120
    while not (rd / "config.yaml").exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
    time.sleep(0.5)
    p.kill()
    p.communicate()


@attack()
def resume_after_kill_before_first_checkpoint(ctx: Ctx) -> list[str]:
    rd = ctx.path("dead_resume")
    _kill_before_first_checkpoint(ctx, rd)
    p = ctx.T("--resume", rd, "total_steps=120")
    problems = expect_ok(p)
    if p.rc == 0 and not (rd / "summary.json").exists():
        problems.append("no summary after the restarted run")
    return problems


@attack()
def fresh_run_into_dir_killed_before_first_checkpoint(ctx: Ctx) -> list[str]:
    rd = ctx.path("dead_fresh")
    _kill_before_first_checkpoint(ctx, rd)
    return expect_ok(ctx.T(*RL, "total_steps=120", f"run_dir={rd}"))


@attack()
def stale_temp_file_removed_on_resume(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "stale_tmp")
    stale = rd / "checkpoints" / ".latest.pt.k1ll3d.tmp"
    stale.write_bytes(b"half a checkpoint")
    problems = expect_ok(ctx.T("--resume", rd, "total_steps=200"))
    if stale.exists() or temp_files(rd):
        problems.append("the stale temporary file is still there")
    return problems


@attack()
def overrides_before_and_after_config_train(ctx: Ctx) -> list[str]:
    cfg = ctx.path("cfg.yaml")
    cfg.write_text("total_steps: 120\n")
    rd = ctx.path("intermixed")
    p = ctx.T(*RL[:6], "--config", cfg, *RL[6:], f"run_dir={rd}")
    problems = expect_ok(p)
    if p.rc == 0 and yaml.safe_load((rd / "config.yaml").read_text())["total_steps"] != 120:
        problems.append("the --config file was not applied")
    return problems


@attack()
def overrides_before_and_after_config_continual(ctx: Ctx) -> list[str]:
    cfg = ctx.path("cfg.yaml")
    cfg.write_text("stream:\n  num_tasks: 2\n")
    rd = ctx.path("intermixed_cl")
    return expect_ok(ctx.C(*CL[:3], "--config", cfg, *CL[3:], f"run_dir={rd}"))


@attack()
def override_before_resume(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "override_first")
    return expect_ok(ctx.T("total_steps=200", "--resume", rd))


@attack()
def run_dir_is_a_file(ctx: Ctx) -> list[str]:
    f = ctx.path("a_file")
    f.write_text("keep me\n")
    return expect_error(ctx.T(*RL, f"run_dir={f}"), 2,
                        "not a directory") + (["file changed"] if f.read_text() != "keep me\n" else [])


@attack()
def empty_run_dir(ctx: Ctx) -> list[str]:
    cwd = ctx.path("cwd")
    cwd.mkdir()
    p = ctx.run(["-m", "sac_spectral.train", *RL, "total_steps=100", "run_dir="], cwd=cwd)
    wrote = [f"wrote into the current directory: {os.listdir(cwd)}"] if any(cwd.iterdir()) else []
    return expect_error(p, 2, "run_dir") + wrote


@attack()
def config_is_a_directory(ctx: Ctx) -> list[str]:
    d = ctx.path("cfgdir")
    d.mkdir()
    return expect_error(ctx.T("--config", d), 2, "directory")


@attack()
def duplicate_yaml_keys(ctx: Ctx) -> list[str]:
    f = ctx.path("dup.yaml")
    f.write_text("total_steps: 100\ntotal_steps: 200\n")
    rd = ctx.path("dup_rd")
    return expect_error(ctx.T("--config", f, *RL, f"run_dir={rd}"), 2,
                        "duplicate") + (["run dir written"] if rd.exists() else [])


@attack()
def diagnose_on_a_continual_run(ctx: Ctx) -> list[str]:
    p = ctx.D(ctx.fixture("RC"))
    if p.rc == 0:
        return expect_ok(p)
    return expect_error(p, 2, "continual")


def _kill_randomly(ctx: Ctx, tool: str, seed: int) -> list[str]:
    rd = ctx.path(f"kill_{tool}_{seed}")
    rng = random.Random(seed)
    if tool == "train":
        argv = ["-m", "sac_spectral.train", *RL, "total_steps=1000000", "checkpoint_every=25", f"run_dir={rd}"]
    else:
        argv = ["-m", "sac_spectral.continual", *CL, "stream.num_tasks=100000", "stream.iters_per_task=5",
                f"run_dir={rd}"]
    p = ctx.popen(argv)
    deadline = time.monotonic() + 180
    while not (rd / CKPT).exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 2.0))
    p.kill()
    p.communicate()
    problems, state = checkpoint_sound(rd / CKPT)
    if state is None:
        return problems
    if tool == "train":
        step = int(state["step"])
        r = ctx.T("--resume", rd, f"total_steps={step + 30}")
    else:
        r = ctx.C("--resume", rd, f"stream.num_tasks={int(state['iteration']) // 5 + 2}")
    return problems + expect_ok(r)


for _seed in range(4):
    register(f"kill9_random_train_{_seed}", lambda ctx, s=_seed: _kill_randomly(ctx, "train", s))
for _seed in range(2):
    register(f"kill9_random_continual_{_seed}", lambda ctx, s=_seed: _kill_randomly(ctx, "continual", s))


def _kill_during_write(ctx: Ctx, seed: int) -> list[str]:
    """Big networks make every checkpoint write take a while; kill when a temp file appears."""
    rd = ctx.path(f"kill_write_{seed}")
    argv = ["-m", "sac_spectral.train", *RL, "actor.hidden=[1024, 1024]", "critic.hidden=[1024, 1024]",
            "random_steps=1000000", "total_steps=1000000", "checkpoint_every=100", f"run_dir={rd}"]
    p = ctx.popen(argv)
    rng = random.Random(seed)
    deadline = time.monotonic() + 180
    seen = 0
    while p.poll() is None and time.monotonic() < deadline:
        if (rd / "checkpoints").is_dir() and temp_files(rd):
            seen += 1
            if seen > 1 + seed:  # not always the first write
                time.sleep(rng.uniform(0.0, 0.02))
                break
            while temp_files(rd) and p.poll() is None:
                time.sleep(0.002)
        time.sleep(0.002)
    p.kill()
    p.communicate()
    if not (rd / CKPT).exists():
        return ["no checkpoint after several writes"]
    problems, state = checkpoint_sound(rd / CKPT)
    if state is None:
        return problems
    r = ctx.T("--resume", rd, f"total_steps={int(state['step']) + 20}")
    return problems + expect_ok(r)


for _seed in range(3):
    register(f"kill9_during_checkpoint_write_{_seed}", lambda ctx, s=_seed: _kill_during_write(ctx, s))


def _signal_attack(tool: str, sig: int, twice: bool = False) -> Callable[[Ctx], list[str]]:
    def fn(ctx: Ctx) -> list[str]:
        rd = ctx.path(f"signal_{tool}")
        if tool == "train":
            argv = ["-m", "sac_spectral.train", *RL, "total_steps=1000000", f"run_dir={rd}"]
        else:
            argv = ["-m", "sac_spectral.continual", *CL, "stream.num_tasks=100000", "stream.iters_per_task=5",
                    f"run_dir={rd}"]
        p = ctx.popen(argv)
        deadline = time.monotonic() + 120
        while not (rd / "config.yaml").exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.0)
        p.send_signal(sig)
        if twice:
            time.sleep(0.001)
            p.send_signal(sig)
        out, err = p.communicate(timeout=120)
        res = Proc(argv, p.returncode, out, err)
        problems = expect_ok(res, 128 + sig)
        if twice:
            return problems
        if f"--resume {rd}" not in err:
            problems.append("no resume command printed")
        bad, state = checkpoint_sound(rd / CKPT)
        if state is None:
            return problems + bad
        if tool == "train":
            r = ctx.T("--resume", rd, f"total_steps={int(state['step']) + 20}")
        else:
            r = ctx.C("--resume", rd, f"stream.num_tasks={int(state['iteration']) // 5 + 2}")
        return problems + bad + expect_ok(r)

    fn.__name__ = f"{signal.Signals(sig).name}{'_twice' if twice else ''}_{tool}"
    return fn


for _tool in ("train", "continual"):
    attack()(_signal_attack(_tool, signal.SIGINT))
    attack()(_signal_attack(_tool, signal.SIGTERM))
attack()(_signal_attack("train", signal.SIGINT, twice=True))


def _plain_error(tool: str, args: Sequence[str], code: int, *fragments: str) -> Callable[[Ctx], list[str]]:
    def fn(ctx: Ctx) -> list[str]:
        rd = ctx.path("plain")
        base = RL if tool == "train" else CL
        p = (ctx.T if tool == "train" else ctx.C)(*base, *args, f"run_dir={rd}")
        return expect_error(p, code, *fragments) + (["run dir written"] if rd.exists() else [])

    fn.__name__ = f"{tool}_" + "_".join(a.split("=")[0].strip("-").replace(".", "_") for a in args)
    return fn


for _tool, _args, _frag in [
    ("train", ["critic.lrr=1e-3"], "critic.lrr"), ("train", ["total_steps=ten"], "total_steps"),
    ("train", ["replay_ratio=-2"], "replay_ratio"), ("train", ["env=dmc:cheetah-runn"], "cheetah-run"),
    ("train", ["env="], "env"), ("train", ["critic.regularizers=[{name: nope}]"], "nope"),
    ("train", ["critic.regularizers=[{name: spectral, coef: -1}]"], "coef"),
    ("train", ["critic.regularizers=[{name: spectral, cof: 1}]"], "cof"),
    ("train", ["critic.regularizers=spectral"], "regularizers"),
    ("train", ["device=cuda:7"], "device"), ("train", ["precision=fp16"], "precision"),
    ("train", ["num_seeds=0"], "num_seeds"), ("train", ["total_steps=0"], "total_steps"),
    ("train", ["batch_size=0"], "batch_size"), ("train", ["critic.hidden=[]"], "hidden"),
    ("train", ["critic.hidden=[0, 5]"], "hidden"), ("train", ["critic.hidden=32"], "hidden"),
    ("train", ["critic.activation=swish"], "activation"), ("train", ["gamma=1.5"], "gamma"),
    ("train", ["actor.log_std_min=3"], "log_std_min"), ("train", ["critic.num_critics=0"], "num_critics"),
    ("train", ["resets.what=some"], "resets.what"), ("train", ["diagnostics.batch_size=1"], "batch_size"),
    ("train", ["total_steps"], "total_steps"), ("train", ["=5"], "empty key"), ("train", ["a..b=1"], "empty key"),
    ("train", ["critic.lr=[1, 2"], "critic.lr"), ("train", ["progress=maybe"], "progress"),
    ("train", ["total_steps=1e3.5"], "total_steps"), ("train", ["x" * 5000 + "=1"], "unknown"),
    ("continual", ["dataset.name=imagenet"], "dataset.name"), ("continual", ["stream.kind=shuffle"], "stream.kind"),
    ("continual", ["model.name=deep_linear"], "deep_linear"), ("continual", ["dtype=float16"], "dtype"),
    ("continual", ["optimizer.beta2=1"], "beta2"), ("continual", ["stream.iters_per_task=0"], "iters_per_task"),
    ("continual", ["dataset.name=mnist", "dataset.data_dir=/nonexistent"], "mnist"),
    ("continual", ["model.name=vit", "model.patch=3"], "patch"),
    ("continual", ["dataset.synthetic.classes=1", "dataset.name=synthetic"], "classes"),
    ("continual", ["regularizers=[{name: redo, tau: 2}]"], "tau"),
]:
    attack()(_plain_error(_tool, _args, 2, _frag))

for _args, _frags in [
    (["agent=crossq", "critic.arch=bronet", "total_steps=100"], ("critic.arch", "crossq")),
    (["agent=crossq", "critic.layer_norm=true", "total_steps=100"], ("critic.layer_norm", "crossq")),
    (["agent=redq", "critic.num_critics=1", "total_steps=100"], ("redq.num_min", "critic.num_critics")),
    (["agent=redq", "critic.num_critics=3", "redq.num_min=5", "total_steps=100"],
     ("redq.num_min", "critic.num_critics")),
]:
    attack()(_plain_error("train", _args, 2, *_frags))


def _config_file_attack(name: str, text: str | bytes, fragment: str) -> Callable[[Ctx], list[str]]:
    def fn(ctx: Ctx) -> list[str]:
        f = ctx.path(f"{name}.yaml")
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
        rd = ctx.path("cfgfile_rd")
        return expect_error(ctx.T("--config", f, f"run_dir={rd}"), 2,
                            fragment) + (["run dir written"] if rd.exists() else [])

    fn.__name__ = f"config_file_{name}"
    return fn


for _name, _text, _frag in [
    ("not_yaml", "a: [1, 2\n", "yaml"), ("a_list", "- 1\n- 2\n", "mapping"),
    ("unknown_key", "totl_steps: 5\n", "totl_steps"),
    ("python_tag", "total_steps: !!python/object/apply:os.system ['true']\n", "yaml"),
    ("nested_wrong", "critic: 5\n", "critic"),
]:
    attack()(_config_file_attack(_name, _text, _frag))


@attack()
def option_of_an_agent_not_selected(ctx: Ctx) -> list[str]:
    """``agent=sac td3.policy_delay=3``: the option would be thrown away."""
    rd = ctx.path("other_agent_option")
    p = ctx.T(*RL, "total_steps=100", "agent=sac", "td3.policy_delay=3", f"run_dir={rd}")
    message = "td3.policy_delay is an option of agent td3; this run's agent is sac"
    return expect_error(p, 2, message) + (["run dir written"] if rd.exists() else [])


@attack()
def missing_config_file(ctx: Ctx) -> list[str]:
    return expect_error(ctx.T("--config", ctx.ws / "nope.yaml"), 2, "nope.yaml")


@attack()
def resume_with_config(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "resume_config")
    f = ctx.path("c.yaml")
    f.write_text("total_steps: 5\n")
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "--config", f), 2, "--config") + unchanged(before, rd)


@attack()
def resume_nonexistent(ctx: Ctx) -> list[str]:
    return expect_error(ctx.T("--resume", ctx.ws / "no_such_run"), 2, "no_such_run")


@attack()
def resume_non_resumable_override(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "resume_bad_key")
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "critic.lr=1"), 2, "critic.lr") + unchanged(before, rd)


@attack()
def resume_continual_run_with_train(ctx: Ctx) -> list[str]:
    rd = ctx.copy("RC", "wrong_tool")
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "total_steps=10"), 2) + unchanged(before, rd)


@attack()
def existing_run_dir_not_overwritten(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "exists")
    before = snapshot(rd)
    return expect_error(ctx.T(*RL, f"run_dir={rd}"), 2, "--resume") + unchanged(before, rd)


@attack()
def hand_written_config_in_the_run_dir_is_kept(ctx: Ctx) -> list[str]:
    rd = ctx.path("own_config")
    rd.mkdir()
    (rd / "config.yaml").write_text("# my notes\ntotal_steps: 60\n")
    before = snapshot(rd)
    problems = expect_error(ctx.T("--config", rd / "config.yaml", *RL, f"run_dir={rd}"), 2, "run_dir")
    return problems + expect_error(ctx.T("--resume", rd), 2, "latest.pt") + unchanged(before, rd)


@attack()
def resume_without_config_yaml(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "no_config")
    (rd / "config.yaml").unlink()
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "total_steps=200"), 2, "config.yaml") + unchanged(before, rd)


@attack()
def resume_with_garbage_config_yaml(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "garbage_config")
    (rd / "config.yaml").write_text("replay_ratio: [\n")
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "total_steps=200"), 2, "config.yaml") + unchanged(before, rd)


@attack()
def resume_with_unknown_key_in_config_yaml(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "unknown_config_key")
    with open(rd / "config.yaml", "a") as f:
        f.write("bogus: 1\n")
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "total_steps=200"), 2, "bogus") + unchanged(before, rd)


@attack()
def resume_after_editing_a_resumable_key(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "edit_resumable")
    _edit_config(rd, "total_steps", 200)
    p = ctx.T("--resume", rd)
    problems = expect_ok(p)
    if p.rc == 0 and '"steps": 200' not in (rd / "summary.json").read_text():
        problems.append("the edited total_steps was not honoured")
    return problems


@attack()
def resume_finished_run_with_summary_but_no_checkpoint(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "no_ckpt_summary")
    (rd / CKPT).unlink()
    before = snapshot(rd)
    return expect_error(ctx.T("--resume", rd, "total_steps=200"), 2, "latest.pt") + unchanged(before, rd)


@attack()
def resume_extends_a_finished_run(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "extend")
    p = ctx.T("--resume", rd, "total_steps=200")
    problems = expect_ok(p)
    bad, state = checkpoint_sound(rd / CKPT)
    if state is not None and int(state["step"]) != 200:
        problems.append(f"checkpoint at step {state['step']}, expected 200")
    return problems + bad


@attack()
def resume_at_the_same_total_steps(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "same_total")
    return expect_ok(ctx.T("--resume", rd, "total_steps=150"))


@attack()
def diagnose_a_run(ctx: Ctx) -> list[str]:
    out = ctx.path("values.json")
    p = ctx.D(ctx.fixture("R"), "--json", out, "--batch-size", "32")
    return expect_ok(p) + ([] if out.exists() else ["no JSON written"])


@attack()
def diagnose_nonexistent(ctx: Ctx) -> list[str]:
    return expect_error(ctx.D(ctx.ws / "nothing_here"), 2, "nothing_here")


@attack()
def diagnose_without_checkpoint(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "diag_no_ckpt")
    (rd / CKPT).unlink()
    return expect_error(ctx.D(rd), 2, "latest.pt")


@attack()
def diagnose_unknown_option(ctx: Ctx) -> list[str]:
    p = ctx.D(ctx.fixture("R"), "--bogus")
    return expect_ok(p, 2)


@attack()
def total_steps_one(ctx: Ctx) -> list[str]:
    return expect_ok(ctx.T(*RL, "total_steps=1", f"run_dir={ctx.path('one_step')}"))


@attack()
def random_steps_beyond_total(ctx: Ctx) -> list[str]:
    return expect_ok(ctx.T(*RL, "total_steps=60", "random_steps=1000", f"run_dir={ctx.path('all_random')}"))


@attack()
def buffer_size_one_batch_size_one(ctx: Ctx) -> list[str]:
    return expect_ok(ctx.T(*RL, "total_steps=80", "buffer_size=1", "batch_size=1", f"run_dir={ctx.path('tiny_buf')}"))


@attack()
def tiny_replay_ratio_and_width_one(ctx: Ctx) -> list[str]:
    return expect_ok(ctx.T(*RL, "total_steps=100", "replay_ratio=0.001", "critic.hidden=[1]", "actor.hidden=[1]",
                           f"run_dir={ctx.path('tiny_rr')}"))


@attack()
def every_interval_one(ctx: Ctx) -> list[str]:
    return expect_ok(ctx.T(*RL, "total_steps=70", "log_every=1", "checkpoint_every=1", "eval_every=20",
                           "diagnostics.every=5", "diagnostics.batch_size=8", f"run_dir={ctx.path('every1')}"))


@attack()
def huge_action_repeat_and_three_seeds(ctx: Ctx) -> list[str]:
    return expect_ok(ctx.T(*RL, "total_steps=60", "action_repeat=50", "num_seeds=3", f"run_dir={ctx.path('repeat')}"))


@attack()
def unicode_and_spaces_in_run_dir(ctx: Ctx) -> list[str]:
    rd = ctx.path("ünïcode dir ✓")
    p = ctx.T(*RL, "total_steps=60", f"run_dir={rd}")
    return expect_ok(p) + ([] if (rd / CKPT).exists() else ["no checkpoint"])


@attack()
def absurd_replay_ratio(ctx: Ctx) -> list[str]:
    rd = ctx.path("rr_absurd")
    p = ctx.T(*RL, "total_steps=100", "replay_ratio=1e300", f"run_dir={rd}")
    return expect_error(p, 2, "replay_ratio") + (["run dir written"] if rd.exists() else [])


@attack()
def huge_probe_sizes_are_bounded_by_the_data(ctx: Ctx) -> list[str]:
    problems = expect_ok(ctx.T(*RL, "total_steps=80", "diagnostics.every=10", "diagnostics.batch_size=1000000000",
                               f"run_dir={ctx.path('probe_rl')}"))
    return problems + expect_ok(ctx.C(*CL, "probe_size=1000000000", f"run_dir={ctx.path('probe_cl')}"))


@attack()
def continual_tiny_everything(ctx: Ctx) -> list[str]:
    return expect_ok(ctx.C(*CL, "batch_size=1", "stream.subset=1", "stream.iters_per_task=1", "eval_examples=1",
                           "probe_size=1", f"run_dir={ctx.path('cl_tiny')}"))


@attack()
def continual_subset_beyond_dataset(ctx: Ctx) -> list[str]:
    p = ctx.C(*CL, "stream.subset=100000", f"run_dir={ctx.path('cl_subset')}")
    return expect_ok(p) if p.rc == 0 else expect_error(p, 2, "subset")


@attack()
def continual_class_incremental_more_classes_than_exist(ctx: Ctx) -> list[str]:
    rd = ctx.path("cl_classes")
    p = ctx.C(*CL, "stream.kind=class_incremental", "stream.classes_per_task=100", f"run_dir={rd}")
    return expect_ok(p) if p.rc == 0 else expect_error(p, 2, "classes")


@attack()
def rl_diverges(ctx: Ctx) -> list[str]:
    rd = ctx.path("diverge_rl")
    p = ctx.T(*RL, "total_steps=600", "checkpoint_every=100", "critic.lr=1e12", "actor.lr=1e12", f"run_dir={rd}")
    problems = expect_error(p, 1, "non-finite")
    if (rd / CKPT).exists():
        problems += checkpoint_sound(rd / CKPT)[0]
    return problems


@attack()
def continual_diverges_in_float64(ctx: Ctx) -> list[str]:
    rd = ctx.path("diverge_cl64")
    p = ctx.C(*CL, "dtype=float64", "optimizer.name=sgd", "optimizer.lr=1e6", f"run_dir={rd}")
    problems = expect_error(p, 1, "non-finite")
    if (rd / CKPT).exists():
        problems += checkpoint_sound(rd / CKPT)[0]
    return problems


@attack()
def cifar_pickle_with_code(ctx: Ctx) -> list[str]:
    root = ctx.path("cifar_evil")
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {root / 'PWNED'}",))

    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (d / name).write_bytes(pickle.dumps({b"data": Evil(), b"labels": [0]}))
    rd = ctx.path("cifar_rd")
    p = ctx.C(*CL, "dataset.name=cifar10", f"dataset.data_dir={root}", f"run_dir={rd}")
    return expect_error(p, 2, "cifar") + (["pickled code ran"] if (root / "PWNED").exists() else [])


@attack()
def cifar_truncated_pickle(ctx: Ctx) -> list[str]:
    root = ctx.path("cifar_trunc")
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (d / name).write_bytes(pickle.dumps({b"data": [1, 2, 3], b"labels": [0]})[:10])
    p = ctx.C(*CL, "dataset.name=cifar10", f"dataset.data_dir={root}", f"run_dir={ctx.path('cifar_rd')}")
    return expect_error(p, 2, "data_batch_1")


@attack()
def svhn_garbage_mat(ctx: Ctx) -> list[str]:
    root = ctx.path("svhn_bad")
    d = root / "svhn"
    d.mkdir(parents=True)
    for name in ("train_32x32.mat", "test_32x32.mat"):
        (d / name).write_bytes(b"MATLAB 5.0 MAT-file garbage" + bytes(200))
    p = ctx.C(*CL, "dataset.name=svhn", f"dataset.data_dir={root}", f"run_dir={ctx.path('svhn_rd')}")
    return expect_error(p, 2, "32x32.mat")


@attack()
def mnist_wrong_length_body(ctx: Ctx) -> list[str]:
    root = _mnist_dir(ctx, "idx_len")
    f = root / "mnist" / "t10k-images-idx3-ubyte"
    f.write_bytes(f.read_bytes()[:-7])
    p = ctx.C(*CL, "dataset.name=mnist", f"dataset.data_dir={root}", f"run_dir={ctx.path('idx_rd')}")
    return expect_error(p, 2, "t10k-images-idx3-ubyte")


@attack()
def mnist_files_are_fine(ctx: Ctx) -> list[str]:
    root = _mnist_dir(ctx, "idx_ok")
    return expect_ok(ctx.C(*CL, "dataset.name=mnist", f"dataset.data_dir={root}", f"run_dir={ctx.path('idx_ok_rd')}"))


@attack()
def two_resumes_of_one_run_at_once(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "two_resumes")
    procs = [ctx.popen(["-m", "sac_spectral.train", "--resume", rd, "total_steps=3000"]) for _ in range(2)]
    outputs = [p.communicate() for p in procs]
    results = [Proc([], p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]
    codes = sorted(r.rc for r in results)
    problems = []
    if codes != [0, 2]:
        problems.append(f"exit codes {codes}: both resumed the same run at once (expected one to be refused)")
    for r in results:
        if traceback_in(r):
            problems.append(f"traceback ({r.show()})")
    return problems + checkpoint_sound(rd / CKPT)[0]


@attack()
def help_of_every_tool(ctx: Ctx) -> list[str]:
    problems = []
    for module in ("sac_spectral.train", "sac_spectral.continual", "sac_spectral.diagnose"):
        problems += expect_ok(ctx.run(["-m", module, "--help"]))
    return problems


# ------------------------------------------------------------- paths, sizes and files that cannot be used
def _alias_bomb(levels: int) -> str:
    """A YAML list whose ``levels`` nested levels of 9 aliases expand to 9 ** levels strings."""
    parts = ["&a0 [x, x, x, x, x, x, x, x, x]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


@attack()
def diagnose_json_to_a_device(ctx: Ctx) -> list[str]:
    """A character device (a pipe where mknod needs root) is not replaced by the JSON file, and
    the diagnostics do not run before the refusal."""
    node = ctx.path("device")
    if AS_ROOT:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    else:
        os.mkfifo(node)
    kind = os.lstat(node).st_mode
    p = ctx.D(ctx.fixture("R"), "--json", node)
    problems = expect_error(p, 2, node.name, "regular file")
    if os.lstat(node).st_mode != kind:
        problems.append("the device was replaced")
    return problems + (["the diagnostics ran before the refusal"] if p.out.strip() else [])


@attack()
def diagnose_plot_in_an_unknown_format(ctx: Ctx) -> list[str]:
    out = ctx.path("plot.txt")
    p = ctx.D(ctx.fixture("R"), "--plot", out)
    problems = expect_error(p, 2, "'txt'", "png")
    if out.exists():
        problems.append("a file was written")
    return problems + (["the diagnostics ran before the refusal"] if p.out.strip() else [])


@attack()
def diagnose_more_threads_than_cores(ctx: Ctx) -> list[str]:
    return expect_error(ctx.D(ctx.fixture("R"), "--threads", "100000"), 2, "--threads", "cores")


def _threads_attack(tool: str) -> Callable[[Ctx], list[str]]:
    def fn(ctx: Ctx) -> list[str]:
        rd = ctx.path("threads")
        p = ctx.T(*RL, "total_steps=60", "threads=100000", f"run_dir={rd}") if tool == "train" else \
            ctx.C(*CL, "threads=100000", f"run_dir={rd}")
        return expect_error(p, 2, "threads", "cores") + (["run dir written"] if rd.exists() else [])

    fn.__name__ = f"{tool}_more_threads_than_cores"
    return fn


attack()(_threads_attack("train"))
attack()(_threads_attack("continual"))


@attack()
def continual_absurd_depth(ctx: Ctx) -> list[str]:
    rd = ctx.path("deep")
    p = ctx.C(*CL, "model.depth=100000", "model.width=2", f"run_dir={rd}", timeout=60)
    return expect_error(p, 2, "depth", "1000") + (["run dir written"] if rd.exists() else [])


@attack()
def config_file_alias_bomb(ctx: Ctx) -> list[str]:
    f = ctx.path("bomb.yaml")
    f.write_text(f"critic:\n  hidden: {_alias_bomb(9)}\n")
    rd = ctx.path("bomb_rd")
    p = ctx.T("--config", f, f"run_dir={rd}", timeout=60)
    return expect_error(p, 2, "alias") + (["run dir written"] if rd.exists() else [])


@attack()
def alias_bomb_override_is_not_spelled_out(ctx: Ctx) -> list[str]:
    """Aliases within the bound: the error names the key and shows the value cut short."""
    rd = ctx.path("small_bomb_rd")
    p = ctx.T(*RL, f"total_steps={_alias_bomb(4)}", f"run_dir={rd}", timeout=60)
    problems = expect_error(p, 2, "total_steps")
    if len(p.err) > 1000:
        problems.append(f"{len(p.err)} characters on stderr")
    return problems


@attack()
def config_file_recursive_alias(ctx: Ctx) -> list[str]:
    f = ctx.path("loop.yaml")
    f.write_text("critic:\n  hidden: &a [1, *a]\n")
    return expect_error(ctx.T("--config", f, f"run_dir={ctx.path('loop_rd')}"), 2, "alias")


@attack()
def config_file_nested_too_deeply(ctx: Ctx) -> list[str]:
    f = ctx.path("deep.yaml")
    f.write_text("critic:\n  hidden: " + "[" * 5000 + "]" * 5000 + "\n")
    return expect_error(ctx.T("--config", f, f"run_dir={ctx.path('deep_rd')}"), 2, "nested")


def _unbuildable_env(env_id: str, cause: str) -> Callable[[Ctx], list[str]]:
    def fn(ctx: Ctx) -> list[str]:
        rd = ctx.path("env")
        p = ctx.T(*RL, "total_steps=60", f"env={env_id}", f"run_dir={rd}")
        return expect_error(p, 2, env_id, cause) + (["run dir written"] if rd.exists() else [])

    fn.__name__ = f"registered_env_that_cannot_be_built_{env_id.split('/')[0].replace('-', '_').lower()}"
    return fn


attack()(_unbuildable_env("Reacher-v2", "gymnasium-robotics"))
attack()(_unbuildable_env("dm_control/compatibility-env-v0", "missing"))
if importlib.util.find_spec("jax") is None:  # gymnasium's phys2d envs need jax (the bench extra installs it)
    attack()(_unbuildable_env("phys2d/Pendulum-v0", "jax"))


def _long_run_dir(tool: str) -> Callable[[Ctx], list[str]]:
    def fn(ctx: Ctx) -> list[str]:
        rd = ctx.ws / ("x" * 300)
        p = ctx.T(*RL, "total_steps=60", f"run_dir={rd}") if tool == "train" else ctx.C(*CL, f"run_dir={rd}")
        return expect_error(p, 2, "run_dir", "too long")

    fn.__name__ = f"{tool}_run_dir_name_too_long"
    return fn


attack()(_long_run_dir("train"))
attack()(_long_run_dir("continual"))


@attack()
def resume_name_too_long(ctx: Ctx) -> list[str]:
    return expect_error(ctx.T("--resume", ctx.ws / ("x" * 300)), 2, "--resume", "too long")


# ----- runs stopped early, finished runs, runs that train nothing
def _eval_steps(rd: Path) -> list[int]:
    """The steps of ``rd/evals.csv`` (one seed: one row per evaluation)."""
    f = rd / "evals.csv"
    header, *rows = (f.read_text().splitlines() if f.exists() else []) or [""]
    return [int(line.split(",")[0]) for line in rows if line.count(",") == header.count(",")]


def _kill_after_two_evaluations(ctx: Ctx, rd: Path) -> list[str]:
    """kill -9 a run once evals.csv holds two evaluations, before its first checkpoint (as a crash
    between the default first evaluation and first checkpoint does)."""
    p = ctx.popen(["-m", "sac_spectral.train", *RL, "total_steps=100000", "checkpoint_every=0", "eval_every=25",
                   f"run_dir={rd}"])
    deadline = time.monotonic() + 180
    while p.poll() is None and len(_eval_steps(rd)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    p.kill()
    p.communicate()
    killed = len(_eval_steps(rd)) >= 2 and not (rd / CKPT).exists()
    return [] if killed else ["the run was not killed after two evaluations"]


@attack()
def resume_after_kill_after_evaluations_before_first_checkpoint(ctx: Ctx) -> list[str]:
    rd = ctx.path("dead_after_evals_resume")
    problems = _kill_after_two_evaluations(ctx, rd)
    problems += expect_ok(ctx.T("--resume", rd, "total_steps=120", "eval_every=60"))
    if _eval_steps(rd) != [60, 120]:
        problems.append(f"evals.csv holds steps {_eval_steps(rd)}, expected the restarted run's [60, 120]")
    return problems


@attack()
def fresh_run_into_dir_killed_after_evaluations(ctx: Ctx) -> list[str]:
    rd = ctx.path("dead_after_evals_fresh")
    problems = _kill_after_two_evaluations(ctx, rd)
    problems += expect_ok(ctx.T(*RL, "total_steps=100", "eval_every=50", f"run_dir={rd}"))
    if _eval_steps(rd) != [50, 100]:
        problems.append(f"evals.csv holds steps {_eval_steps(rd)}, expected the new run's [50, 100]")
    return problems


@attack()
def resume_of_a_finished_run_changes_nothing(ctx: Ctx) -> list[str]:
    rd = ctx.copy("R", "finished_resume")
    before, stamps = snapshot(rd), {p: p.stat().st_mtime_ns for p in [rd, *rd.rglob("*")]}
    p = ctx.T("--resume", rd)
    problems = expect_ok(p) + unchanged(before, rd)
    if {q: q.stat().st_mtime_ns for q in [rd, *rd.rglob("*")]} != stamps:
        problems.append("modification times changed")
    lines = (p.out + p.err).strip().splitlines()
    if len(lines) != 1 or "is finished at step 150" not in lines[0]:
        problems.append(f"expected one line saying the run is finished, got {lines[:3]}")
    return problems


@attack()
def run_that_does_no_update_says_so(ctx: Ctx) -> list[str]:
    rd = ctx.path("no_updates")
    p = ctx.T(*RL, "total_steps=40", f"run_dir={rd}")  # random_steps=50
    problems = expect_ok(p)
    warnings = [ln for ln in p.err.splitlines() if ln.startswith("warning:")]
    if len(warnings) != 1 or "0 updates" not in warnings[0]:
        problems.append(f"expected one warning of 0 updates, got {warnings}")
    summary = yaml.safe_load((rd / "summary.json").read_text()) if (rd / "summary.json").exists() else {}
    if summary.get("updates") != 0 or not summary.get("warnings") or summary.get("best_eval_return") is not None:
        problems.append("summary.json does not record the 0 updates (updates, warnings, best_eval_return null)")
    return problems


# ----- task sequences
#: a one-task sequence of 100 steps on RL's cartpole-balance
SEQ = ["tasks=[{env: dmc:cartpole-balance}]", "steps_per_task=100"]


@attack()
def dynamics_that_blow_the_simulator_up_end_in_one_line_after_a_checkpoint(ctx: Ctx) -> list[str]:
    rd = ctx.path("gravity_1e9")
    p = ctx.T(*RL, "tasks=[{dynamics: {gravity: 1.0e9}}]", "steps_per_task=100", f"run_dir={rd}")
    problems = expect_error(p, 1, "the simulator failed in stage 0", "gravity=1e+09", "checkpoint written")
    if not (rd / CKPT).is_file():
        return problems + ["no checkpoint was written"]
    return problems + expect_error(ctx.T("--resume", rd), 2, "would fail the same way")


@attack()
def dynamics_of_an_infinite_range_are_refused(ctx: Ctx) -> list[str]:
    rd = ctx.path("gravity_inf")
    problems = expect_error(ctx.T(*RL, "tasks=[{dynamics: {gravity: [1.0, .inf]}}]", "steps_per_task=100",
                                  f"run_dir={rd}"),
                            2, "tasks[0].dynamics.gravity", "finite")
    return problems + (["the run directory was created"] if rd.exists() else [])


@attack()
def a_hundred_million_cycles_are_refused_at_once(ctx: Ctx) -> list[str]:
    p = ctx.T(*RL, *SEQ, "cycles=100000000", f"run_dir={ctx.path('cycles_1e8')}", timeout=120)
    return expect_error(p, 2, "100000000 stages", "at most 10000")


@attack()
def a_finished_sequence_is_extended_by_cycles_not_total_steps(ctx: Ctx) -> list[str]:
    rd = ctx.path("sequence_extended")
    problems = expect_ok(ctx.T(*RL, *SEQ, f"run_dir={rd}"))
    before = snapshot(rd)
    p = ctx.T("--resume", rd)
    if not p.out.strip().endswith(f"To extend it: --resume {rd} cycles=N with N > 1"):
        problems.append(f"the finished message does not name cycles: {p.out.strip()[-200:]}")
    problems += expect_error(ctx.T("--resume", rd, "total_steps=400"), 2, "total_steps=400 would not take effect",
                             "cycles")
    problems += unchanged(before, rd)
    problems += expect_ok(ctx.T("--resume", rd, "cycles=2"))
    if _eval_steps(rd)[-1:] != [200]:
        problems.append(f"the extended run's evaluations end at {_eval_steps(rd)[-1:]}, expected step 200")
    return problems


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Ctx:
    return Ctx(tmp_path_factory.mktemp("attacks"))


@pytest.mark.parametrize(
    "case", [pytest.param(a, id=a.name) for a in ATTACKS]
)
def test_attack(ctx: Ctx, case: Attack) -> None:
    problems = case.fn(ctx)
    assert not problems, "; ".join(problems)
