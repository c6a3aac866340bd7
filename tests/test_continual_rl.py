"""Continual RL: task sequences switch at their steps, resume exactly, draw per seed, are measured
(forgetting, plasticity) and refused in one line where they cannot run."""

import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import yaml

from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.apps.rl.stages import stage_metrics
from sac_spectral.core.config import ConfigError, from_dict
from sac_spectral.envs import EnvPool
from sac_spectral.envs.tasks import Permuted, mujoco_model
from sac_spectral.runs.checkpoint import load_checkpoint
from sac_spectral.runs.evals import read_evals
from sac_spectral.runs.layout import CHECKPOINT
from test_train import ROOT, _assert_same_state, run

TINY = ["action_repeat=8", "random_steps=4", "eval_episodes=1", "batch_size=8", "actor.hidden=[16,16]",
        "critic.hidden=[16,16]", "threads=1", "progress=false", "checkpoint_every=0", "diagnostics.every=0"]
#: three stages of 7 steps: another task, then heavier and more slippery, then permuted
SEQUENCE = ("tasks=[{env: dmc:cartpole-swingup}, {env: dmc:cartpole-balance, dynamics: {mass: 2.0, friction: [0.5, "
            "2.0]}},"
            " {env: dmc:cartpole-swingup, permute_obs: true, permute_actions: true}]")


def _record(monkeypatch) -> list[list[dict]]:
    """Per pool step, what each seed's env is: its task, total mass, friction and permutations."""
    seen: list[list[dict]] = []
    step = EnvPool.step

    def recording(pool, actions):
        seen.append([{"task": env.spec.id, "mass": float(mujoco_model(env).body_mass.sum()),
                      "friction": float(mujoco_model(env).geom_friction[:, 0].sum()),
                      "obs_perm": tuple(env.d.obs_perm) if isinstance(env, Permuted) else None,
                      "act": ((tuple(env.d.act_perm), tuple(env.d.act_sign.tolist()))
                              if isinstance(env, Permuted) else None)}
                     for env in pool.envs])
        return step(pool, actions)

    monkeypatch.setattr(EnvPool, "step", recording)
    return seen


def test_every_switch_happens_at_the_step_the_config_names(tmp_path, monkeypatch):
    seen = _record(monkeypatch)
    rd = tmp_path / "run"
    assert run(TINY + [SEQUENCE, "steps_per_task=7", "eval_every=3", f"run_dir={rd}"]) == 0
    assert len(seen) == 21
    first = seen[0][0]
    for t, (env,) in enumerate(seen):
        stage = t // 7
        assert env["task"] == ("dm_control/cartpole-balance-v0" if stage == 1 else "dm_control/cartpole-swingup-v0"), t
        assert (env["mass"] == pytest.approx(2 * first["mass"])) == (stage == 1), t
        assert (env["friction"] != pytest.approx(first["friction"])) == (stage == 1), t
        assert (env["obs_perm"] is not None) == (stage == 2) and (env["act"] is not None) == (stage == 2), t
    assert sorted(seen[14][0]["obs_perm"]) == list(range(5)) and seen[14][0]["obs_perm"] != tuple(range(5))
    rows = read_evals(rd)
    by_step = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append((r["task"], r["stage"]))
    names = ["0-cartpole-swingup", "1-cartpole-balance", "2-cartpole-swingup"]
    assert by_step[3] == [(names[0], 0)] and by_step[9] == [(names[1], 1)] and by_step[15] == [(names[2], 2)]
    for step, stage in ((7, 0), (14, 1), (21, 2)):  # every task at each switch and at the end
        assert sorted(by_step[step]) == [(n, stage) for n in names], step
    summary = json.loads((rd / "summary.json").read_text())
    assert [s["step"] for s in summary["continual"]["switches"]] == [7, 14]
    assert summary["steps"] == 21 and set(summary["continual"]["tasks"]) == set(names)


def test_each_seed_draws_what_its_single_seed_run_draws(tmp_path, monkeypatch):
    seen = _record(monkeypatch)
    args = TINY + [SEQUENCE, "steps_per_task=3", "eval_every=0"]
    assert run(args + ["num_seeds=2", f"run_dir={tmp_path / 'both'}"]) == 0
    both = list(seen)
    seen.clear()
    assert run(args + ["seed=1", f"run_dir={tmp_path / 'one'}"]) == 0
    one = list(seen)
    stage1, stage2 = both[3], both[6]
    assert stage1[0]["friction"] != stage1[1]["friction"] and stage2[0]["obs_perm"] != stage2[1]["obs_perm"]
    assert [s[1] for s in both] == [s[0] for s in one]


@pytest.mark.slow
def test_a_run_killed_right_after_a_switch_resumes_bit_for_bit(tmp_path):
    """kill -9 in the stage after a switch, whose checkpoint is the switch's: the resumed run's
    checkpoint and evaluations equal the uninterrupted run's."""
    args = [*TINY, "seed=3", "num_seeds=2", "replay_ratio=2", "random_steps=30", "batch_size=16", SEQUENCE,
            "steps_per_task=60", "eval_every=20", "checkpoint_every=60", "on_switch.buffer=clear",
            "on_switch.reset=last:1", "on_switch.optimizer=reset", "diagnostics.every=50", "diagnostics.batch_size=32"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert run(args + [f"run_dir={straight}"]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "sac_spectral.train", *args, f"run_dir={killed}"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while proc.poll() is None and not any(r["step"] > 60 for r in read_evals(killed)):
            time.sleep(0.02)
    finally:
        proc.kill()
        err = proc.communicate()[1]
    assert proc.returncode == -9, err
    assert load_checkpoint(killed / CHECKPOINT)["step"] in (60, 120)
    assert run(["--resume", killed]) == 0
    a, b = load_checkpoint(straight / CHECKPOINT), load_checkpoint(killed / CHECKPOINT)
    assert a["step"] == b["step"] == 180
    del a["torch_rng"], b["torch_rng"]  # the process's global generator, which a run does not draw from
    _assert_same_state(a, b)
    assert a["evals"] == b["evals"]
    drop = lambda rows: [{k: v for k, v in r.items() if k != "wall_time_s"} for r in rows]  # noqa: E731
    assert drop(read_evals(straight)) == drop(read_evals(killed))


def test_a_cleared_buffer_warms_each_stage_up_as_the_run_began(tmp_path):
    """Each stage's first 4 steps act at random with no update; its evaluations there are marked
    ``warmup`` (the networks are the stage before's) and count in no stage's best."""
    rd = tmp_path / "run"
    assert run(TINY + ["tasks=[{env: dmc:cartpole-swingup, permute_obs: true}]", "cycles=3", "steps_per_task=10",
                       "random_steps=4", "replay_ratio=2", "eval_every=2", "on_switch.buffer=clear",
                       f"run_dir={rd}"]) == 0
    rows = read_evals(rd)
    assert [r["updates"] for r in rows] == [0, 0, 4, 8, 12, 12, 12, 16, 20, 24, 24, 24, 28, 32, 36]
    assert [r["step"] for r in rows if r["warmup"]] == [2, 4, 12, 14, 22, 24]
    cfg = from_dict(TrainConfig, {k: v for k, v in yaml.safe_load((rd / "config.yaml").read_text()).items()})
    summary = json.loads((rd / "summary.json").read_text())
    assert cfg.total_updates == summary["updates"] == 36
    (task,) = summary["continual"]["tasks"].values()
    assert task["warmup_steps"] == [2, 4, 12, 14, 22, 24]
    for stage in (0, 1, 2):
        trained = [r["return"] for r in rows if r["stage"] == stage and not r["warmup"]]
        assert task["best_per_stage"][str(stage)] == [max(trained)]
    assert summary["best_eval_return"] == max(r["return"] for r in rows if not r["warmup"])


@pytest.mark.parametrize("networks, passed", [("[]", None), ("[critic]", ["critic"])])
def test_a_switch_resets_the_networks_on_switch_names(tmp_path, monkeypatch, networks, passed):
    from sac_spectral.agents.sac import SAC

    calls = []
    reset = SAC.reset
    monkeypatch.setattr(SAC, "reset", lambda agent, last=None, networks=None: (calls.append((last, networks)),
                                                                             reset(agent, last, networks)))
    assert run(TINY + ["tasks=[{}]", "cycles=2", "steps_per_task=6", "on_switch.reset=all",
                       f"on_switch.networks={networks}", f"run_dir={tmp_path / 'run'}"]) == 0
    assert calls == [(None, passed)]


@pytest.mark.parametrize("buffer", ["keep", "clear"])
def test_simbav2s_reward_scale_restarts_its_return_at_each_switch(tmp_path, buffer):
    """The switch cuts the episodes (cartpole's last 125 steps at action repeat 8; a stage has 7): the
    running return at the end sums the last stage's rewards only (with the earlier stages' it would
    hold 0.99^7 of theirs); its statistics go on with a kept buffer (21 returns) and restart with a
    cleared one (7)."""
    rd = tmp_path / "run"
    assert run(TINY + [SEQUENCE, "steps_per_task=7", "eval_every=0", "reward_scale=simbav2",
                       f"on_switch.buffer={buffer}", f"run_dir={rd}"]) == 0
    state = load_checkpoint(rd / CHECKPOINT)["buffer"]
    rewards = state["data"]["reward"][:, -7:].double()
    discounted = (rewards * 0.99 ** torch.arange(6, -1, -1, dtype=torch.float64)).sum(dim=1)
    torch.testing.assert_close(state["reward_scale"]["G"], discounted, rtol=1e-6, atol=0)
    assert state["reward_scale"]["count"] == (21 if buffer == "keep" else 7)


@pytest.mark.parametrize("ratio", [0.3, 1.0, 2.0])
def test_updates_owed_skip_every_warm_up_after_a_cleared_buffer(ratio):
    """updates_by against a step-by-step count: each step adds what the replay ratio owes it, except
    the steps of a later stage's warm-up, over 6 000 stages."""
    cfg = from_dict(TrainConfig, {"tasks": [{"name": "a"}, {"name": "b"}], "steps_per_task": 7, "cycles": 3000,
                                  "random_steps": 3, "replay_ratio": ratio, "on_switch": {"buffer": "clear"}})
    owed = lambda step: int(max(0, step - 3) * ratio + 1e-9)  # noqa: E731
    count, seq = 0, cfg.sequence()
    for step in range(1, cfg.total_steps + 1):
        count += 0 if step > 7 and (step - 1) % 7 < 3 else owed(step) - owed(step - 1)
        assert seq.updates_by(step) == count, step


def test_a_finished_sequence_is_extended_by_its_cycles_as_a_straight_run(tmp_path, capsys):
    """One cycle, then --resume cycles=2: the switch at the old end happens on resume (cleared
    buffer, heads re-drawn, optimizer reset), and the run ends as a straight two-cycle run does.
    The finished run names cycles as the key that extends it; total_steps is refused in one line."""
    args = TINY + ["tasks=[{env: dmc:cartpole-swingup, permute_obs: true}]", "steps_per_task=10", "eval_every=5",
                   "log_every=5", "on_switch.buffer=clear", "on_switch.reset=last:1", "on_switch.optimizer=reset"]
    straight, extended = tmp_path / "straight", tmp_path / "extended"
    assert run(args + ["cycles=2", f"run_dir={straight}"]) == 0
    assert run(args + [f"run_dir={extended}"]) == 0
    capsys.readouterr()
    assert run(["--resume", extended]) == 0
    assert capsys.readouterr().out.strip().endswith(f"To extend it: --resume {extended} cycles=N with N > 1")
    assert run(["--resume", extended, "total_steps=20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: total_steps=20 would not take effect") and "cycles" in err[0], err
    assert run(["--resume", extended, "cycles=2"]) == 0
    a, b = load_checkpoint(straight / CHECKPOINT), load_checkpoint(extended / CHECKPOINT)
    assert a["step"] == b["step"] == 20 and [s["step"] for s in b["switches"]] == [10]
    del a["torch_rng"], b["torch_rng"]  # the process's global generator, which a run does not draw from
    _assert_same_state(a, b)
    assert a["evals"] == b["evals"]
    drop = lambda rows: [{k: v for k, v in r.items() if k != "wall_time_s"} for r in rows]  # noqa: E731
    assert drop(read_evals(straight)) == drop(read_evals(extended))
    capsys.readouterr()
    assert run(["--resume", extended, "cycles=1"]) == 2
    assert capsys.readouterr().err.strip() == ("error: cycles=1 ends the run at step 10, before its current step 20; "
                                               "give cycles >= 2")


def test_a_plain_run_is_one_stage_of_its_env(tmp_path):
    rd = tmp_path / "run"
    assert run(TINY + ["env=dmc:cartpole-balance", "total_steps=10", "eval_every=5", f"run_dir={rd}"]) == 0
    assert [(r["task"], r["stage"]) for r in read_evals(rd)] == [("dmc:cartpole-balance", 0)] * 2
    assert "continual" not in json.loads((rd / "summary.json").read_text())


def test_a_sequence_config_names_its_tasks_and_length():
    cfg = from_dict(TrainConfig, {"env": "dmc:walker-walk", "steps_per_task": 100, "cycles": 2,
                                  "tasks": [{},
                                            {"env": "dmc:walker-run", "name": "run", "dynamics": {"gravity": 0.5}}]})
    assert cfg.total_steps == 400 and cfg.env == "dmc:walker-walk"
    assert [t["name"] for t in cfg.tasks] == ["0-walker-walk", "run"] and cfg.tasks[0]["env"] == "dmc:walker-walk"
    seq = cfg.sequence()
    stages = [(s.index, s.cycle, s.task) for s in map(seq.stage, range(len(seq)))]
    assert stages == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    keys = ("env", "tasks", "steps_per_task", "cycles")
    assert from_dict(TrainConfig, {k: getattr(cfg, k) for k in keys}).tasks == cfg.tasks


def test_a_long_sequence_builds_its_stages_when_asked():
    """A sequence's stages are computed, not listed: a billion cycles cost nothing to look up."""
    from sac_spectral.envs.tasks import TaskSequence, parse_tasks

    seq = TaskSequence(parse_tasks([{"name": "a"}, {"name": "b"}], "dmc:walker-walk"), 10, cycles=10**9)
    assert len(seq) == 2 * 10**9 and seq.total_steps == 2 * 10**10
    last = seq.stage_at(10**11)
    assert (last.index, last.cycle, last.task) == (2 * 10**9 - 1, 10**9 - 1, 1)
    assert seq.latest(0, 35).index == 2 and seq.latest(1, 5).index == 1 and seq.latest(1, 10**11).index == 2 * 10**9 - 1


@pytest.mark.parametrize(("args", "fragment"), [
    (["tasks=[{env: dmc:cartpole-swingup, colour: red}]", "steps_per_task=5"],
     "tasks[0]: unknown key 'colour'; valid keys: env,"),
    (["tasks=[{dynamics: {friction: -1}}]", "steps_per_task=5"],
     "tasks[0].dynamics.friction: expected a finite factor > 0"),
    (["tasks=[{dynamics: {gravity: [1.0, .inf]}}]", "steps_per_task=5"],
     "tasks[0].dynamics.gravity: expected a finite factor"),
    (["tasks=[{dynamics: {mass: .nan}}]", "steps_per_task=5"], "tasks[0].dynamics.mass: expected a finite factor"),
    (["tasks=[{dynamics: {wind: 2}}]", "steps_per_task=5"], "unknown 'wind'; valid: friction, mass, gravity, gear"),
    (["tasks=[{name: a}, {name: a}]", "steps_per_task=5"], "names must be unique"),
    (["tasks=[{}]"], "steps_per_task: must be >= 1"),
    (["tasks=[{}]", "steps_per_task=5", "cycles=100000000"],
     "cycles: 1 task(s) x 100000000 cycles = 100000000 stages; at most"),
    (["cycles=2"], "cycles: only a task sequence (tasks) repeats; leave it at 1 (got 2)"),
    (["tasks=[{}]", "steps_per_task=5", "on_switch.reset=last"],
     "on_switch.reset: 'last' is not one of none, all, last:<k>"),
    (["tasks=[{}]", "steps_per_task=5", "on_switch.buffer=drop"], "on_switch.buffer: 'drop' is not one of keep, clear"),
    (["tasks=[{}]", "steps_per_task=5", "on_switch.networks=[value]"],
     "on_switch.networks: 'value' is not one of actor, critic"),
    (["tasks=[{}]", "steps_per_task=5", "on_switch.networks=[critic, critic]"],
     "on_switch.networks: names a network twice"),
    (["tasks=[{env: dmc:cartpole-swingup}, {env: dmc:walker-walk}]", "steps_per_task=5"],
     "a sequence's tasks must share their shapes"),
    (["tasks=[{env: dmc:cartpole-swingup}, {env: dmc:cartpole-flip}]", "steps_per_task=5"], "unknown environment"),
])
def test_a_sequence_that_cannot_run_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys, args, fragment):
    rd = tmp_path / "run"
    assert run(TINY + args + [f"run_dir={rd}"]) == 2
    err = "\n".join(line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("config: "))
    assert fragment in err and len(err.splitlines()) == 1, err  # besides the config line a run prints first
    assert not rd.exists()


def test_dynamics_the_simulator_cannot_integrate_end_the_run_in_one_line_after_a_checkpoint(tmp_path, capsys):
    """Stage 1's gravity × 1e9 blows MuJoCo's state up at its first evaluation (the switch): the run
    ends with exit 1 and one line naming the stage and its dynamics, its checkpoint holds stage 0's
    training, and a resume says in one line that it would fail again."""
    rd = tmp_path / "run"
    tasks = "tasks=[{env: dmc:cartpole-balance}, {env: dmc:cartpole-balance, dynamics: {gravity: 1.0e9}}]"
    assert run(TINY + [tasks, "steps_per_task=7", "eval_every=0", f"run_dir={rd}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith("error: the simulator failed in stage 1 (task 1-cartpole-balance, dynamics "
                              "gravity=1e+09): "
                              "Physics state is invalid"), err[-1]
    assert err[-1].endswith(f"at step 7; stopping; checkpoint written to {rd / CHECKPOINT}"), err[-1]
    state = load_checkpoint(rd / CHECKPOINT)
    assert state["step"] == 7 and state["agent"] and "stage 1" in state["failure"]
    assert run(["--resume", rd]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ended at step 7 because the simulator failed in stage 1" in err[0], err


def test_stage_metrics_follow_their_definitions():
    """Two tasks × two cycles, steps_per_task 10, one seed: hand-computed final, best, forgetting
    and plasticity."""
    evals = [(5, "a", 0, 100.0), (10, "a", 0, 400.0), (10, "b", 0, 50.0), (15, "b", 1, 300.0), (20, "a", 1, 350.0),
             (20, "b", 1, 600.0), (30, "a", 2, 200.0), (30, "b", 2, 500.0), (40, "a", 3, 200.0), (40, "b", 3, 450.0)]
    rows = [{"step": s, "seed": 0, "task": t, "stage": st, "return": r} for s, t, st, r in evals]
    m = stage_metrics(rows, ["a", "b", "a", "b"], 10, [0])
    a, b = m["tasks"]["a"], m["tasks"]["b"]
    assert a["final"] == [200.0] and b["final"] == [450.0] and a["first"] == [400.0] and b["first"] == [600.0]
    assert a["forgetting"] == [400.0 - 200.0] and b["forgetting"] == [600.0 - 450.0]
    assert a["best_per_stage"] == {"0": [400.0], "1": [350.0], "2": [200.0], "3": [200.0]}
    assert a["plasticity"] == {"2": [200.0 / 400.0]} and b["plasticity"] == {"3": [450.0 / 600.0]}
    assert m["final_average"] == [325.0] and m["first_average"] == [500.0]
    assert m["plasticity_by_stage"] == {"2": [0.5], "3": [0.75]}
    assert m["stage_end"] == {"0": [400.0], "1": [600.0], "2": [200.0], "3": [450.0]} and m["seeds"] == [0]


def test_plasticity_against_fresh_networks_divides_by_the_reference_on_the_same_seed_and_stage():
    """Per seed, the mean over later stages of a method's stage-end return over the fresh-network
    reference's on the same seed and stage; the reference scores 1; a stage the reference failed
    (return 0) and a seed it did not run are left out; no reference, no measure."""
    from pathlib import Path

    from sac_spectral.studies.sequences import Sequences, continual_section, fresh_plasticity

    a, b = Path("a"), Path("b")
    seqs = Sequences(stage_end={
        "plain": {(a, 0): {0: 0.6, 1: 0.2, 2: 0.3, 3: 0.5}, (a, 1): {0: 0.1, 1: 0.1}, (a, 7): {1: 0.9}},
        "reset_all": {(b, 0): {0: 0.5, 1: 0.4, 2: 0.6, 3: 0.0}, (b, 1): {0: 0.2, 1: 0.4}},
    })
    fresh = fresh_plasticity(seqs, "reset_all")
    assert fresh["plain"] == pytest.approx([(0.2 / 0.4 + 0.3 / 0.6) / 2, 0.1 / 0.4])
    assert fresh["reset_all"] == pytest.approx([1.0, 1.0])
    assert fresh_plasticity(seqs, "missing") == {}
    seqs.final = {"plain": [0.3, 0.1], "reset_all": [0.4, 0.4]}
    table = continual_section(seqs, lambda scores, func: ({m: func(v) for m, v in scores.items()},
                                                          {m: np.stack([func(v), func(v)]) for m, v in scores.items()}),
                              {}, "reset_all")
    assert "plasticity vs fresh networks (`reset_all`)" in "\n".join(table)


@pytest.mark.parametrize("marked", [True, False], ids=["warmup column", "evals.csv before it"])
def test_an_evaluation_in_a_warm_up_counts_in_no_best_and_no_forgetting(marked):
    """The issue's case: after a cleared buffer, an evaluation in stage 1's random-action warm-up
    scores stage 0's networks (311.8, a luckier draw of the episodes than at stage 0's end). It
    is neither stage 1's best nor the best that forgetting falls from; only the final return may be
    such an evaluation. Files written before the ``warmup`` column are told by their ``updates``."""
    evals = [(5, 0, 2, 100.0, 0), (10, 0, 12, 250.0, 0), (15, 1, 12, 311.8, 1), (20, 1, 22, 96.1, 0)]
    rows = [{"step": s, "seed": 0, "task": "a", "stage": st, "updates": u, "return": r,
             **({"warmup": w} if marked else {})}
            for s, st, u, r, w in evals]
    a = stage_metrics(rows, ["a", "a"], 10, [0])["tasks"]["a"]
    assert a["best_per_stage"] == {"0": [250.0], "1": [96.1]} and a["warmup_steps"] == [15]
    assert a["forgetting"] == [pytest.approx(250.0 - 96.1)] and a["final"] == [96.1]
    assert a["first"] == [250.0] and a["plasticity"] == {"1": [pytest.approx(96.1 / 250.0)]}


def test_dynamics_and_permutations_act_on_the_simulator_and_the_agent():
    """An env's stage draw scales its MuJoCo model and permutes what the agent sees and does."""
    from sac_spectral.envs.tasks import TaskSequence, parse_tasks, stage_env

    def env_of(task: dict):
        return stage_env(TaskSequence(parse_tasks([task], "dmc:cheetah-run"), 10).stage(0), seed=0, env_seed=1)

    heavy = env_of({"dynamics": {"mass": 0.5, "gravity": 2.0, "gear": [0.5, 0.5]}})
    permuted, plain = env_of({"permute_obs": True, "permute_actions": True}), env_of({})
    m, p = mujoco_model(heavy), mujoco_model(plain)
    np.testing.assert_allclose(m.body_mass, 0.5 * p.body_mass)
    np.testing.assert_allclose(m.opt.gravity, 2.0 * p.opt.gravity)
    np.testing.assert_allclose(m.actuator_gear[:, 0], 0.5 * p.actuator_gear[:, 0])
    obs, _ = permuted.reset(seed=5)
    ref, _ = plain.reset(seed=5)
    np.testing.assert_array_equal(obs, ref[permuted.d.obs_perm])
    a = np.linspace(-0.9, 0.9, 6).astype(np.float32)
    permuted.step(a)
    plain.step(permuted.d.act_sign * a[permuted.d.act_perm])
    ctrl = [e.unwrapped._env.physics.data.ctrl for e in (permuted, plain)]
    assert not np.array_equal(ctrl[0], a)
    np.testing.assert_array_equal(*ctrl)


def test_a_sequence_with_dynamics_on_a_gymnasium_mujoco_env():
    pytest.importorskip("gymnasium.envs.mujoco.half_cheetah_v5")
    from sac_spectral.envs.tasks import TaskSequence, parse_tasks, stage_env

    try:
        stage = TaskSequence(parse_tasks([{"env": "HalfCheetah-v5", "dynamics": {"friction": 0.25}}], "x"), 5).stage(0)
        env, plain = stage_env(stage, 0,
                               1), stage_env(TaskSequence(parse_tasks([{"env": "HalfCheetah-v5"}], "x"), 5).stage(0), 0,
                                             1)
    except Exception as err:  # noqa: BLE001 - no mujoco here
        pytest.skip(f"HalfCheetah-v5 cannot be built: {err}")
    np.testing.assert_allclose(mujoco_model(env).geom_friction[:, 0], 0.25 * mujoco_model(plain).geom_friction[:, 0])


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^tasks\[1\]: expected a mapping"):
        from_dict(TrainConfig, {"tasks": [{}, "walker"], "steps_per_task": 3})


def test_play_replays_the_last_evaluation_in_the_stage_it_ended(tmp_path, capsys):
    """The policy of a sequence that ended on a permuted stage plays that stage's env: replaying
    its last evaluation gives the recorded return."""
    from sac_spectral.apps.rl.play import main as play_main
    from sac_spectral.runs.cli import run_cli

    rd = tmp_path / "run"
    assert run(TINY + [SEQUENCE, "steps_per_task=7", "eval_every=0", "eval_episodes=2", f"run_dir={rd}"]) == 0
    capsys.readouterr()
    assert run_cli(play_main, [str(rd), "--last-eval", "--seed-index", "0"]) == 0
    out = capsys.readouterr().out
    played = float(re.search(r"^return: (\S+)", out, re.M).group(1))
    recorded = float(re.search(r"^recorded by the run at step 21: (\S+)", out, re.M).group(1))
    assert played == pytest.approx(recorded, abs=1e-6) and out.startswith("dmc:cartpole-swingup")


def test_the_report_tabulates_forgetting_and_plasticity_and_correlates_the_switch_diagnostics(tmp_path, capsys):
    """The correlation pairs each measure at a switch with the next stage's return over the runs
    that keep their networks there: a run whose switches re-draw them adds no pairs."""
    from sac_spectral.studies.report import main as report_main

    rd, redrawn = tmp_path / "run", tmp_path / "redrawn"
    args = TINY + ["tasks=[{env: dmc:cartpole-swingup, permute_obs: true}]", "cycles=3", "steps_per_task=10",
                   "num_seeds=2", "eval_every=5", "diagnostics.every=1000", "diagnostics.batch_size=16"]
    assert run(args + [f"run_dir={rd}"]) == 0
    assert run(args + ["on_switch.reset=all", f"run_dir={redrawn}"]) == 0
    summary = json.loads((rd / "summary.json").read_text())["continual"]
    assert [len(s["diagnostics"]["grad_rank/critic/erank"]) for s in summary["switches"]] == [2, 2]
    out = tmp_path / "report"
    assert report_main([str(tmp_path / "redrawn"), "--out", str(tmp_path / "report_redrawn"), "--reps", "50"]) == 0
    assert "switch_correlation" not in json.loads((tmp_path / "report_redrawn" / "report.json").read_text())
    assert report_main([str(rd), "--out", str(out), "--reps", "50"]) == 0
    data = json.loads((out / "report.json").read_text())
    (method, row), = data["continual"].items()
    assert row["final"]["values"] == pytest.approx([v / 1000 for v in summary["final_average"]])
    assert row["plasticity/2"]["values"] == pytest.approx(summary["plasticity_by_stage"]["2"])
    assert row["final"]["iqm"][0] == pytest.approx(np.mean(row["final"]["values"]))  # IQM of two = their mean
    assert data["switch_correlation"]["grad_rank/critic/erank"]["n"] == 4  # 2 seeds × 2 switches
    text = (out / "report.md").read_text()
    assert "## Continual RL: final return, forgetting and plasticity" in text and "continual_tasks.png" in text
    assert (out / "continual_tasks.png").stat().st_size > 0
    # the ordinary curves follow the current task: one evaluation per step and seed
    assert len(data["methods"][method]["seeds"]) == 2


def test_the_report_tabulates_the_mechanism_at_the_switches_and_the_value_scale(tmp_path):
    """Every layer's σ_max is in the switch diagnostics even where the training metrics logged it at
    the same step; the report's mechanism tables are the means of the switch diagnostics, the
    ``q/mean`` logged at each stage's end and ``diagnose --json RUN/mechanism.json``'s Q-scale."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sac_spectral.diagnose import main as diagnose_main
    from sac_spectral.runs.layout import MECHANISM
    from sac_spectral.studies.report import main as report_main

    rd = tmp_path / "run"
    assert run(TINY + ["tasks=[{env: dmc:cartpole-swingup, permute_obs: true}]", "cycles=3", "steps_per_task=10",
                       "num_seeds=2", "eval_every=5", "log_every=5", "diagnostics.every=1000",
                       "diagnostics.batch_size=16", f"run_dir={rd}"]) == 0
    switches = json.loads((rd / "summary.json").read_text())["continual"]["switches"]
    for switch in switches:
        d = switch["diagnostics"]
        assert all(len(d[f"spectral/critic/layer{i}/sigma_max"]) == 2 for i in range(3))
        assert all(a >= b > 0 for a, b in zip(d["spectral/critic/layer1/sigma_max"],
                                              d["spectral/critic/layer1/sigma_min"]))
    assert diagnose_main([str(rd), "--q-scale", "1", "--json", str(rd / MECHANISM)]) == 0
    out = tmp_path / "report"
    assert report_main([str(rd), "--out", str(out), "--reps", "20"]) == 0
    data = json.loads((out / "report.json").read_text())
    (means,) = data["mechanism_switches"].values()
    erank = [v for s in switches for v in s["diagnostics"]["grad_rank/critic/erank"]]
    assert means["grad_rank/critic/erank"] == pytest.approx(np.mean(erank))
    sigma = [v for s in switches for v in s["diagnostics"]["spectral/actor/layer2/sigma_max"]]
    assert means["sigma_max/actor/2"] == pytest.approx(np.mean(sigma))
    (scale,) = data["value_scale"].values()
    acc = EventAccumulator(str(rd))
    acc.Reload()
    q = {s: {e.step: e.value for e in acc.Scalars(f"seed{s}/q/mean")} for s in (0, 1)}
    assert scale["stage_q"] == pytest.approx([np.mean([q[s][end] for s in (0, 1)]) for end in (10, 20, 30)])
    values = json.loads((rd / MECHANISM).read_text())["values"]
    assert scale["bias"] == pytest.approx(values["q_scale/normalized_bias"]) and scale["stage_bias"] == []
    assert data["switch_correlation"]["q/mean"]["n"] == 4  # the critics' Q at 2 switches × 2 seeds
    text = (out / "report.md").read_text()
    assert "## Mechanism at the task switches" in text and "## The value scale" in text
    # a run whose switches did not record σ_max: the values its training metrics logged at the switch
    summary = json.loads((rd / "summary.json").read_text())
    for switch in summary["continual"]["switches"]:
        switch["diagnostics"] = {k: v for k, v in switch["diagnostics"].items() if not k.endswith("sigma_max")}
    (rd / "summary.json").write_text(json.dumps(summary))
    assert report_main([str(rd), "--out", str(out), "--reps", "20"]) == 0
    (means,) = json.loads((out / "report.json").read_text())["mechanism_switches"].values()
    logged = [e.value for s in (0, 1) for e in acc.Scalars(f"seed{s}/spectral/critic/layer1/sigma_max")
              if e.step in (10, 20)]
    assert len(logged) == 4 and means["sigma_max/critic/1"] == pytest.approx(np.mean(logged))


def test_a_run_measures_the_value_scale_at_every_switch_and_at_its_end_without_changing_its_training(tmp_path):
    """``diagnostics.q_scale``: per seed, at each switch (``switch/q_scale/…``, the switch's record) and
    at the end (``q_scale/…``, ``summary.json``); the run's evaluations are those of the same run
    without it, and the report's per-stage normalized bias is the median over seeds."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sac_spectral.studies.report import main as report_main

    args = TINY + ["tasks=[{env: dmc:cartpole-swingup, permute_obs: true}]", "cycles=3", "steps_per_task=10",
                   "num_seeds=2", "eval_every=5"]
    measured, plain = tmp_path / "measured", tmp_path / "plain"
    assert run(args + ["diagnostics.q_scale=1", f"run_dir={measured}"]) == 0
    assert run(args + [f"run_dir={plain}"]) == 0
    assert [r["return"] for r in read_evals(measured)] == pytest.approx([r["return"] for r in read_evals(plain)],
                                                                       rel=1e-6)
    summary = json.loads((measured / "summary.json").read_text())
    acc = EventAccumulator(str(measured))
    acc.Reload()
    for switch in summary["continual"]["switches"]:
        for key in ("q_mean", "mc_return", "normalized_bias"):
            logged = [acc.Scalars(f"seed{s}/switch/q_scale/{key}") for s in (0, 1)]
            at = [next(e.value for e in series if e.step == switch["step"]) for series in logged]
            assert switch["q_scale"][f"q_scale/{key}"] == pytest.approx(at, rel=1e-6)
    end = summary["q_scale"]
    assert all(np.isfinite(end[f"q_scale/{k}"]).all() and len(end[f"q_scale/{k}"]) == 2
               for k in ("q_mean", "mc_return", "normalized_bias"))
    assert [e.step for e in acc.Scalars("seed0/q_scale/q_mean")] == [30]
    assert "q_scale" not in json.loads((plain / "summary.json").read_text())["continual"]["switches"][0]
    out = tmp_path / "report"
    assert report_main([str(measured), "--out", str(out), "--reps", "20"]) == 0
    (scale,) = json.loads((out / "report.json").read_text())["value_scale"].values()
    at_switches = [np.median(s["q_scale"]["q_scale/normalized_bias"]) for s in summary["continual"]["switches"]]
    assert scale["stage_bias"] == pytest.approx(at_switches + [np.median(end["q_scale/normalized_bias"])])
    assert scale["bias"] == pytest.approx(end["q_scale/normalized_bias"])
    text = (out / "report.md").read_text()
    table = text[text.index("## The value scale"):].split("\n\n")[2].splitlines()
    assert table[0].endswith("(Q − G) / G at the end of each stage, median |")
    assert len({row.count("|") for row in table}) == 1  # the header, its rule and every row: the same columns


def test_a_sequences_start_line_lists_its_stages():
    from pathlib import Path

    from sac_spectral.apps.rl.config import TrainConfig
    from sac_spectral.apps.rl.run import describe
    from sac_spectral.core.config import load_config

    configs = Path(__file__).resolve().parents[1] / "run_configs"
    cfg = load_config(TrainConfig, configs / "sequence_cartpole_permuted.yaml")
    assert "4 stages of 3000 steps: swingup-permuted × 4 cycles" in describe(cfg, [0], "1 thread")
    assert "stages" not in describe(load_config(TrainConfig, configs / "quick.yaml"), [0], "1 thread")
