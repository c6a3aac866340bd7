"""End-to-end runner tests: CLI errors, resume bit-identity, signals, non-finite stops."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import SMALL
from sac_spectral.apps.rl.train import main
from sac_spectral.runs.checkpoint import load_checkpoint
from sac_spectral.runs.layout import CHECKPOINT

ROOT = Path(__file__).resolve().parents[1]
FAST = SMALL + ["random_steps=200", "eval_every=600", "log_every=100", "buffer_size=5000"]
#: a run of a few seconds on DMC: updates from step 60, an evaluation every 50 steps
TINY = ["env=dmc:cartpole-balance", "random_steps=60", "eval_every=50", "eval_episodes=1", "batch_size=16",
        "actor.hidden=[16,16]", "critic.hidden=[16,16]", "threads=1", "progress=false"]


def run(args, capsys=None):
    from sac_spectral.runs.cli import run_cli

    return run_cli(main, [str(a) for a in args])


def snapshot(path: Path) -> dict:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in path.rglob("*")}


def test_short_run_writes_the_run_directory(tmp_path, capsys):
    rd = tmp_path / "run"
    assert run(FAST + ["total_steps=400", f"run_dir={rd}"]) == 0
    out = capsys.readouterr().out
    assert f"tensorboard --logdir {rd.parent}  (this run: {rd.name})" in out
    assert (rd / "config.yaml").is_file() and (rd / CHECKPOINT).is_file()
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["steps"] == 400 and summary["updates"] == 200
    assert {"final_eval_return", "best_eval_return", "random_policy_return", "updates_per_s"} <= set(summary)
    assert any(p.name.startswith("events.out.tfevents") for p in rd.iterdir())


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["critic.lrr=1e-3"], "unknown config key 'critic.lrr'"),
        (["total_steps=ten"], "total_steps: expected an integer"),
        (["replay_ratio=-2"], "replay_ratio: must be > 0"),
        (["critic.regularizers=[{name: nope}]"], "unknown regularizer 'nope'"),
        (["critic.regularizers=[{name: spectral, coef: -1}]"], "coef must be >= 0"),
        (["env=dmc:cheetah-runn"], "close matches: dmc:cheetah-run"),
        (["diagnostics.method=fast"], "diagnostics.method: 'fast' is not one of auto, func, factored"),
        (["critic.regularizers=[{name: plasticity_injection, at_step: 30}, {name: plasticity_injection, at_step: 60}]"],
         "critic.regularizers: 'plasticity_injection' is listed 2 times ([0], [1]); a network takes one"),
        (["actor.arch=simba", "actor.hidden=[32,32]", "actor.regularizers=[{name: nap}]"],
         "nap needs a normalization layer before every nonlinearity (missing after layer blocks.0.linear_in): SimBa's"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, args, fragment):
    rd = tmp_path / "new_run"
    assert run(FAST + args + [f"run_dir={rd}"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    err = "\n".join(line for line in lines if not line.startswith(("config: ", "compile: auto")))  # the start lines
    assert err.startswith("error: ") and fragment in err and "\n" not in err
    assert not rd.exists()


def test_existing_run_dir_is_never_overwritten(tmp_path, capsys):
    rd = tmp_path / "run"
    assert run(FAST + ["total_steps=250", f"run_dir={rd}"]) == 0
    before = snapshot(rd)
    assert run(FAST + ["total_steps=250", f"run_dir={rd}"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert run(["--resume", rd, "critic.lr=1"]) == 2
    assert "cannot change on --resume" in capsys.readouterr().err
    assert run(["--resume", tmp_path / "nothing"]) == 2
    assert snapshot(rd) == before


def _params(rd: Path) -> dict:
    return load_checkpoint(rd / CHECKPOINT)


def _assert_same_state(a, b, path="state"):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            if k not in ("wall_time", "evals"):  # the first half also evaluated at its end
                _assert_same_state(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_state(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


# Every regularizer on both networks; the interventions fire before and after the resume point
# (updates 1…500 before it, 501…1100 after), and the full reset at step 500 rebuilds them all.
EVERY_METHOD = (
    "[{name: l2, coef: 1e-4}, {name: l2_init, coef: 1e-4}, {name: wasserstein_init, coef: 1e-4},"
    " {name: parseval, coef: 1e-4}, {name: spectral_norm, layers: hidden},"
    " {name: shrink_perturb, shrink: 0.01, sigma: 0.01, every: 130}, {name: redo, tau: 0.5, every: 90},"
    " {name: reset, every: 240, last: 1}, "
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        ["replay_ratio=2", "resets.every=500", "critic.regularizers=[{name: spectral, coef: 1e-3}]",
         "actor.regularizers=[{name: spectral, coef: 1e-3}]"],
        ["num_seeds=2", "replay_ratio=0.5", "diagnostics.every=100", "diagnostics.batch_size=64"],
        ["num_seeds=2", "resets.every=500", "critic.layer_norm=true", "critic.activation=crelu",
         "critic.weight_decay=1e-3", "actor.weight_decay=1e-3",
         f"critic.regularizers={EVERY_METHOD}{{name: spectral, coef: 1e-3, mode: all}}]",
         f"actor.regularizers={EVERY_METHOD}{{name: spectral, coef: 1e-3}}]"],
        ["agent=td3", "num_seeds=2", "resets.every=500", "diagnostics.every=100", "diagnostics.batch_size=64",
         "critic.regularizers=[{name: spectral, coef: 1e-3}, {name: redo, tau: 0.5, every: 90}]"],
        ["critic.arch=bronet", "actor.arch=simba", "resets.every=500", "resets.what=last_layers",
         "resets.last_layers=2",
         "diagnostics.every=100", "diagnostics.batch_size=64",
         "critic.regularizers=[{name: redo, tau: 0.5, every: 90}, {name: spectral, coef: 1e-3}]"],
        ["critic.arch=simba", "actor.arch=bronet", "critic.regularizers=[{name: cbp, replacement_rate: 0.01}]",
         "actor.regularizers=[{name: nap}]"],
    ],
    ids=["rr2-resets-spectral", "two-seeds-rr0.5-diagnostics", "two-seeds-every-method", "td3-two-seeds-resets-redo",
         "bronet-critic-simba-actor", "simba-cbp-bronet-nap"],
)
def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path, extra):
    """Stop mid-episode at step 700, resume to 1300 (crossing a 1000-step episode end)."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run(FAST + extra + ["total_steps=1300", f"run_dir={straight}"]) == 0
    assert run(FAST + extra + ["total_steps=700", f"run_dir={split}"]) == 0
    assert run(["--resume", split, "total_steps=1300"]) == 0
    a, b = _params(straight), _params(split)
    assert a["step"] == b["step"] == 1300
    _assert_same_state(a, b)


def test_sigint_checkpoints_and_the_run_resumes(tmp_path):
    """A SIGINT in the middle of training (after its first periodic checkpoint, so that the signal
    cannot land during start-up on a loaded machine) writes a checkpoint at the current step."""
    rd = tmp_path / "run"
    cmd = [sys.executable, "-m", "sac_spectral.train", *FAST, "total_steps=1000000", "checkpoint_every=100",
           "compile=false", f"run_dir={rd}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (rd / CHECKPOINT).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "Traceback" not in err and f"--resume {rd}" in err
    step = load_checkpoint(rd / CHECKPOINT)["step"]
    assert step >= 100
    assert run(["--resume", rd, f"total_steps={step + 50}"]) == 0
    assert json.loads((rd / "summary.json").read_text())["steps"] == step + 50


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    rd = tmp_path / "run"
    code = run(FAST + ["total_steps=3000", "checkpoint_every=200", "critic.lr=1e12", "actor.lr=1e12", f"run_dir={rd}"])
    assert code == 1
    assert "non-finite" in capsys.readouterr().err
    state = load_checkpoint(rd / CHECKPOINT)
    assert all(torch.isfinite(v).all() for v in state["agent"]["modules"].values())
    assert not (rd / "summary.json").exists()


def test_help_lists_keys(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "critic.regularizers" in out and "resets.every" in out and "--resume" in out


def test_seed_of_a_multi_seed_run_matches_its_single_seed_run(tmp_path):
    """Same envs, warm-up actions and random streams; parameters equal to float rounding after
    the first updates (see test_sac.py for why not bit-for-bit)."""
    multi, single = tmp_path / "multi", tmp_path / "single"
    common = FAST + ["total_steps=210", "critic.regularizers=[{name: spectral, coef: 1e-3}]"]
    assert run(common + ["num_seeds=2", "seed=0", f"run_dir={multi}"]) == 0
    assert run(common + ["num_seeds=1", "seed=1", f"run_dir={single}"]) == 0
    a, b = _params(multi), _params(single)
    for key, value in b["agent"]["modules"].items():
        n = value.shape[0]  # 1 for actor and α, num_critics for critics
        torch.testing.assert_close(a["agent"]["modules"][key][n:2 * n], value, rtol=1e-4, atol=1e-5)
    assert torch.equal(a["buffer"]["data"]["obs"][1, :200], b["buffer"]["data"]["obs"][0, :200])
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (multi, single))
    assert sa["per_seed"][1]["random_policy_return"] == sb["per_seed"][0]["random_policy_return"]


@pytest.mark.slow
def test_evaluation_at_a_reset_step_scores_the_trained_agent_also_across_a_resume(tmp_path):
    """rl_with_resets evaluates first, then resets: the evaluation at step 400 of a run that
    resets at 400 equals the final evaluation of the same run stopped at 400 (a trained agent,
    not a fresh one), and a run extended past its last step still applies that reset."""
    ended, straight = tmp_path / "ended", tmp_path / "straight"
    common = FAST + ["eval_every=400", "resets.every=400"]
    assert run(common + ["total_steps=400", f"run_dir={ended}"]) == 0
    assert run(common + ["total_steps=800", f"run_dir={straight}"]) == 0
    first, second = (json.loads((d / "summary.json").read_text())["eval_history"] for d in (ended, straight))
    assert second[0] == first[-1] and second[0]["step"] == 400
    assert run(["--resume", ended, "total_steps=800"]) == 0
    _assert_same_state(_params(straight), _params(ended))


@pytest.mark.slow
def test_resets_at_listed_steps_equal_a_periodic_reset_at_the_same_step(tmp_path):
    """``resets.at=[300]`` in a 400-step run resets once at 300, as ``resets.every=300`` does; the
    two runs end with the same parameters, and differ from a run without a reset."""
    dirs = {name: tmp_path / name for name in ("at", "every", "none")}
    extra = {"at": ["resets.at=[300]"], "every": ["resets.every=300"], "none": []}
    for name, d in dirs.items():
        assert run(FAST + ["total_steps=400", "eval_every=0", f"run_dir={d}"] + extra[name]) == 0
    at, every, none = (_params(d)["agent"] for d in dirs.values())
    _assert_same_state(every, at)
    with pytest.raises(AssertionError):
        _assert_same_state(none, at)


def test_every_evaluation_plays_fresh_episodes():
    from sac_spectral.envs.evaluate import eval_seed

    seeds = {eval_seed(0, step, ep) for step in range(0, 5000, 1000) for ep in range(10)}
    assert len(seeds) == 50 and eval_seed(0, 3000, 1) == eval_seed(0, 3000, 1)


def _evals(rd: Path) -> dict[int, float]:
    import csv

    return {int(r["step"]): float(r["return"]) for r in csv.DictReader((rd / "evals.csv").open())}


def test_an_extended_run_evaluates_as_the_straight_run(tmp_path):
    """A finished 120-step run extended to 260 evaluates once more, at its old end; every other
    evaluation plays the straight run's episodes (reset seeds follow the step, not the count of
    evaluations before) and scores the same agent, so the returns are equal."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run(TINY + ["total_steps=260", f"run_dir={straight}"]) == 0
    assert run(TINY + ["total_steps=120", f"run_dir={split}"]) == 0
    assert run(["--resume", split, "total_steps=260"]) == 0
    a, b = _evals(straight), _evals(split)
    assert set(b) - set(a) == {120} and a == {step: r for step, r in b.items() if step != 120}


def _scalars(rd: Path, tag: str) -> list:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    return EventAccumulator(str(rd), size_guidance={"scalars": 0}).Reload().Scalars(tag)


def test_a_run_logs_its_training_metrics_once_more_at_its_end(tmp_path):
    """With ``log_every`` 150 a 200-step run logs at 150 and at its end; a run that ends on a log
    step logs there once."""
    rd, whole = tmp_path / "run", tmp_path / "whole"
    assert run(TINY + ["total_steps=200", "log_every=150", f"run_dir={rd}"]) == 0
    assert [e.step for e in _scalars(rd, "loss/critic")] == [150, 200]
    assert [e.step for e in _scalars(rd, "perf/updates_per_s")] == [150, 200]
    assert run(TINY + ["total_steps=150", "log_every=75", f"run_dir={whole}"]) == 0
    assert [e.step for e in _scalars(whole, "loss/critic")] == [75, 150]


def test_training_rates_leave_out_evaluation_time(tmp_path, monkeypatch):
    """On a clock that moves a millisecond per reading and an hour per evaluation, the logged
    updates/s are those of the milliseconds: evaluations do not count as training time."""
    import types

    from sac_spectral.apps.rl import evaluation, train

    clock = [0.0]

    def perf_counter() -> float:
        clock[0] += 1e-3
        return clock[0]

    def slow_evaluate(*args):
        clock[0] += 3600.0
        return evaluate(*args)

    evaluate = evaluation.evaluate
    monkeypatch.setattr(train, "time", types.SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setattr(evaluation, "evaluate", slow_evaluate)
    rd = tmp_path / "run"
    assert run(TINY + ["total_steps=200", "log_every=100", f"run_dir={rd}"]) == 0
    rates = [e.value for e in _scalars(rd, "perf/updates_per_s")]
    assert len(rates) == 2 and min(rates) > 100, rates  # 40 and 100 updates in ~0.1 s each


def test_multi_seed_run_directory_names_its_seeds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run(FAST + ["total_steps=201", "num_seeds=3", "seed=4", "eval_every=0"]) == 0
    (rd,) = (tmp_path / "runs").iterdir()
    assert "__s4-6__" in rd.name


class _StopWhen:
    """A stand-in for GracefulStop whose ``requested`` turns to SIGINT once ``condition()`` holds."""

    def __init__(self, condition) -> None:
        self.condition = condition

    @property
    def requested(self):
        return signal.SIGINT if self.condition() else None


@pytest.mark.slow
def test_priming_runs_its_updates_logs_them_and_resumes_mid_priming_exactly(tmp_path, capsys):
    from sac_spectral.apps.rl.train import PRIMING_CHUNK, TrainConfig, Trainer
    from sac_spectral.core.config import load_config
    from sac_spectral.runs.run import Run

    common = FAST + ["random_steps=150", "priming.transitions=150", f"priming.updates={2 * PRIMING_CHUNK + 300}",
                     "total_steps=400", "diagnostics.every=1000", "diagnostics.batch_size=32"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run(common + [f"run_dir={straight}"]) == 0
    summary = json.loads((straight / "summary.json").read_text())
    assert summary["priming_updates"] == 2 * PRIMING_CHUNK + 300
    assert summary["updates"] == 2 * PRIMING_CHUNK + 300 + 250
    assert {"before", "after"} <= set(summary["priming"])
    assert "grad_rank/critic/erank" in summary["priming"]["after"]

    trainer = Trainer(load_config(TrainConfig, overrides=common + [f"run_dir={split}"]))
    trainer.open_new()
    stop = _StopWhen(lambda: trainer.primed >= 2 * PRIMING_CHUNK)
    assert Run("sac_spectral.train", trainer, stop).execute() == 128 + signal.SIGINT
    state = load_checkpoint(split / CHECKPOINT)
    assert state["step"] == 150 and state["primed"] == 2 * PRIMING_CHUNK
    assert "priming update 2000 of 2300" in capsys.readouterr().err
    assert run(["--resume", split]) == 0
    _assert_same_state(_params(straight), _params(split))


@pytest.mark.slow
def test_a_stop_in_the_last_priming_chunk_keeps_the_diagnostics_after_priming(tmp_path):
    from sac_spectral.apps.rl.train import TrainConfig, Trainer
    from sac_spectral.core.config import load_config
    from sac_spectral.runs.run import Run

    common = FAST + ["random_steps=150", "priming.transitions=150", "priming.updates=300", "total_steps=200",
                     "diagnostics.every=1000", "diagnostics.batch_size=32"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run(common + [f"run_dir={straight}"]) == 0
    trainer = Trainer(load_config(TrainConfig, overrides=common + [f"run_dir={split}"]))
    trainer.open_new()
    stop = _StopWhen(lambda: trainer.primed >= 300)
    assert Run("sac_spectral.train", trainer, stop).execute() == 128 + signal.SIGINT
    state = load_checkpoint(split / CHECKPOINT)
    assert state["primed"] == 300 and "after" in state["priming_report"]
    assert run(["--resume", split]) == 0
    after = {d: json.loads((d / "summary.json").read_text())["priming"]["after"] for d in (straight, split)}
    key = "grad_rank/critic/erank"
    assert after[split][key] == pytest.approx(after[straight][key], rel=1e-4)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["priming.updates=-1"], "priming.updates: must be >= 0"),
        (["priming.transitions=6000", "priming.updates=10"], "priming.transitions: must be <= buffer_size (5000)"),
        (["priming.updates=10"], "priming.transitions: must be >= 1 when priming.updates > 0"),
    ],
)
def test_bad_priming_is_refused(tmp_path, capsys, args, fragment):
    assert run(FAST + args + [f"run_dir={tmp_path / 'r'}"]) == 2
    assert fragment in capsys.readouterr().err


def test_a_checkpoint_of_the_old_layout_is_refused_in_one_line(tmp_path, capsys):
    rd = tmp_path / "run"
    assert run(FAST + ["total_steps=210", f"run_dir={rd}"]) == 0
    state = load_checkpoint(rd / CHECKPOINT)
    state["format"] = 1
    torch.save(state, rd / CHECKPOINT)
    assert run(["--resume", rd, "total_steps=300"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: checkpoint {rd / CHECKPOINT}") and "its layout is format 1" in err
    assert "start a new run" in err and "nothing was changed" in err


def test_best_eval_return_counts_only_evaluations_after_the_first_update(tmp_path):
    rd = tmp_path / "run"
    assert run(FAST + ["total_steps=400", "eval_every=100", f"run_dir={rd}"]) == 0
    summary = json.loads((rd / "summary.json").read_text())
    history = summary["eval_history"]
    assert [e["updates"] for e in history] == [0, 0, 100, 200]  # warm-up evaluations stay on the curve
    assert summary["best_eval_return"] == max(e["returns"][0] for e in history if e["updates"] > 0)


def test_sigma_max_has_one_point_per_step_also_where_diagnostics_run(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rd = tmp_path / "run"
    assert run(FAST + ["total_steps=400", "diagnostics.every=100", "diagnostics.batch_size=16", f"run_dir={rd}"]) == 0
    events = EventAccumulator(str(rd), size_guidance={"scalars": 0}).Reload()
    tags = [t for t in events.Tags()["scalars"] if t.startswith("spectral/") and t.endswith("/sigma_max")]
    assert tags
    for tag in tags:
        steps = [e.step for e in events.Scalars(tag)]
        assert len(steps) == len(set(steps)), tag


def test_without_a_terminal_progress_is_a_plain_line_per_twentieth(tmp_path):
    rd = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "sac_spectral.train", *FAST, "progress=true", "total_steps=400",
                           f"run_dir={rd}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert len(lines) == 20 and lines[-1].startswith("step 400/400 (100%)")
    assert "\r" not in proc.stderr  # no progress bar redraws in a log file


def test_threads_0_follows_the_cores_left_idle_during_the_run(tmp_path, monkeypatch):
    """With threads=0 the run applies each new choice of its ThreadWatch (here: one that always
    finds two idle cores, from a start at one thread) and logs it as perf/threads."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import sac_spectral.apps.rl.run as rl_run
    from sac_spectral.core.threads import ThreadWatch

    class TwoIdle(ThreadWatch):
        def due(self) -> bool:
            return True

        def choose(self) -> int:
            return 2

    monkeypatch.setattr(rl_run, "ThreadWatch", TwoIdle)
    rd = tmp_path / "run"
    assert run(FAST + ["total_steps=300", "threads=0", f"run_dir={rd}"]) == 0
    assert torch.get_num_threads() == 2
    events = EventAccumulator(str(rd), size_guidance={"scalars": 0}).Reload()
    assert [e.value for e in events.Scalars("perf/threads")] == [2.0, 2.0, 2.0]
