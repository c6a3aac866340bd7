"""Sweeps on a local Ray instance: layout, status, a trial equals a direct run, SIGKILL of the sweep
and re-run (only unfinished trials run), a bad override fails alone, Ctrl-C, dry run, sweep-file
errors. One local Ray instance serves the module; the SIGKILL case starts one more in the sweep
process it kills."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from sac_spectral.apps.rl.train import main as train_main
from sac_spectral.core.config import ConfigError, merge_sources
from sac_spectral.runs.checkpoint import load_checkpoint
from sac_spectral.runs.cli import run_cli
from sac_spectral.runs.evals import read_evals
from sac_spectral.runs.layout import CHECKPOINT
from sac_spectral.studies import report, spec, sweep
from sac_spectral.studies.trial import error_line

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "kind": "train",
    "base": {
        "env": "dmc:cartpole-balance", "random_steps": 100, "total_steps": 600, "eval_every": 0, "eval_episodes": 1,
        "checkpoint_every": 100, "log_every": 100, "buffer_size": 1000, "batch_size": 32, "diagnostics.every": 0,
        "actor.hidden": [32, 32], "critic": {"hidden": [32, 32]},
    },
    "methods": {
        "sac": {"critic.regularizers": [], "actor.regularizers": []},
        "spectral": {"resets.every": 200, "critic.regularizers": [{"name": "spectral", "coef": 1e-3}]},
        "bad": {"critic.no_such_option": 1},
    },
    "seeds": [0, 1],
}
GOOD = ["sac/s0", "sac/s1", "spectral/s0", "spectral/s1"]


@pytest.fixture(scope="module")
def local_ray():
    """Ray in this process, leaving its signal handlers as they were (ray.init installs a SIGTERM
    handler that would turn a later SIGTERM of the test process into SystemExit in any test)."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    for s, h in handlers.items():
        signal.signal(s, h)
    yield
    ray.shutdown()


def write_sweep(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def status(root: Path) -> dict:
    return json.loads((root / "status.json").read_text())


def snapshot(path: Path) -> dict:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in path.rglob("*")}


@pytest.fixture(scope="module")
def killed_and_rerun(tmp_path_factory, local_ray):
    """Phase 1: a sweep process with one CPU, SIGKILLed once a trial is done and another has
    checkpointed. Phase 2: the same command again, in this process."""
    tmp = tmp_path_factory.mktemp("sweep")
    cfg = write_sweep(tmp / "tiny.yaml", TINY)
    root = tmp / "tiny"
    cmd = [sys.executable, "-m", "sac_spectral.sweep", "--config", str(cfg), "--out", str(tmp), "--num-cpus", "1",
           "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if (root / "status.json").is_file():
            trials = status(root)["trials"]
            running = [t for t, e in trials.items() if e["status"] == "running" and (root / t / CHECKPOINT).is_file()]
            if running and any(e["status"] == "done" for e in trials.values()):
                break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    # A crash of the machine: the sweep and its running trial die at once (a trial whose sweep
    # alone dies checkpoints on SIGTERM, and may even finish before its worker notices).
    os.kill(trials[running[0]]["pid"], signal.SIGKILL)
    proc.kill()
    proc.wait()
    assert not (root / running[0] / "summary.json").is_file(), "the trial finished before it was killed"
    before = status(root)["trials"]
    done_before = [t for t, e in before.items() if e["status"] == "done"]
    snap = {t: snapshot(root / t) for t in done_before}
    code = run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp), "--no-progress"])
    return {"root": root, "cfg": cfg, "tmp": tmp, "code": code, "done_before": done_before, "snap": snap}


def test_layout_and_status_after_the_rerun(killed_and_rerun):
    root = killed_and_rerun["root"]
    assert killed_and_rerun["code"] == 1  # the bad trials failed
    assert {"sweep.yaml", "base.yaml", "status.json", "logs", "sac", "spectral"} <= {p.name for p in root.iterdir()}
    resolved = yaml.safe_load((root / "sweep.yaml").read_text())
    assert resolved["methods"]["spectral"] == {"resets.every": 200,
                                               "critic.regularizers": [{"name": "spectral", "coef": 1e-3}]}
    assert resolved["base"]["diagnostics"] == {"every": 0} and resolved["base"]["actor"] == {"hidden": [32, 32]}
    st = status(root)
    assert st["counts"] == {"done": 4, "running": 0, "pending": 0, "failed": 2}
    for tid in GOOD:
        entry = st["trials"][tid]
        assert entry["status"] == "done" and entry["exit_code"] == 0 and entry["run_dir"] == tid
        assert (root / tid / "summary.json").is_file() and (root / entry["log"]).is_file()
        assert f"run_dir={root / tid}" in entry["command"] or "--resume" in entry["command"]
    for tid in ("bad/s0", "bad/s1"):
        entry = st["trials"][tid]
        assert entry["status"] == "failed" and "\n" not in entry["error"]
        assert entry["error"].startswith("error: unknown config key 'critic.no_such_option'")
        assert not (root / tid).exists()


def test_only_unfinished_trials_ran_again(killed_and_rerun):
    root = killed_and_rerun["root"]
    assert killed_and_rerun["done_before"]
    for tid in killed_and_rerun["done_before"]:
        assert snapshot(root / tid) == killed_and_rerun["snap"][tid], tid
        assert (root / "logs" / f"{tid}.log").read_text().count("=== ") == 1
    resumed = [t for t in GOOD if "--resume" in (root / "logs" / f"{t}.log").read_text()]
    assert resumed, "the trial killed mid-run resumes from its checkpoint"
    assert "resuming" in (root / "logs" / f"{resumed[0]}.log").read_text()


def test_a_trial_equals_the_direct_run_of_its_config(killed_and_rerun, tmp_path):
    """The trial that was killed and resumed in another process ends bit-identical to a direct,
    uninterrupted run of the same command."""
    root = killed_and_rerun["root"]
    tid = next(t for t in GOOD if "--resume" in (root / "logs" / f"{t}.log").read_text())
    trial = next(t for t in spec.load_sweep(str(killed_and_rerun["cfg"]), []).trials if t.id == tid)
    direct = tmp_path / "direct"
    assert run_cli(train_main, ["--config", str(root / "base.yaml"), *trial.overrides, f"run_dir={direct}",
                                "threads=1", "progress=false"]) == 0
    a, b = load_checkpoint(root / tid / CHECKPOINT), load_checkpoint(direct / CHECKPOINT)
    assert a["step"] == b["step"] == 600 and a["agent"]["num_updates"] == b["agent"]["num_updates"]
    for name, tensor in b["agent"]["modules"].items():
        assert torch.equal(a["agent"]["modules"][name], tensor), name
    assert torch.equal(a["buffer"]["data"]["obs"], b["buffer"]["data"]["obs"])
    def timeless(rd: Path) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "wall_time_s"} for row in read_evals(rd)]

    assert timeless(root / tid) == timeless(direct)  # the same evaluations, apart from wall time


def test_rerun_is_idempotent_and_retry_failed_retries_only_failed(killed_and_rerun, capsys):
    root, cfg, tmp = killed_and_rerun["root"], killed_and_rerun["cfg"], killed_and_rerun["tmp"]
    before = {t: snapshot(root / t) for t in GOOD}
    logs = {t: (root / "logs" / f"{t}.log").read_text() for t in GOOD}
    assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp), "--no-progress"]) == 1
    assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp), "--no-progress", "--retry-failed"]) == 1
    err = capsys.readouterr().err
    assert err.count("failed: bad/s0: error: unknown config key 'critic.no_such_option'") == 2
    assert {t: snapshot(root / t) for t in GOOD} == before
    assert {t: (root / "logs" / f"{t}.log").read_text() for t in GOOD} == logs


def test_the_sweep_bar_shows_no_time_left(tmp_path, local_ray, capsys):
    """Trials differ in length: the bar counts them and shows the elapsed time and rate, no estimate."""
    data = {**TINY, "methods": {"sac": TINY["methods"]["sac"]}, "seeds": [0]}
    data["base"] = {**TINY["base"], "total_steps": 150}
    cfg = write_sweep(tmp_path / "bar.yaml", data)
    assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    bars = [line for line in err.replace("\r", "\n").splitlines() if "trial" in line and "|" in line]
    assert bars, err
    assert not any("<" in line for line in bars), bars


def test_report_of_the_sweep(killed_and_rerun, tmp_path):
    out = tmp_path / "report"
    assert run_cli(report.main, [str(killed_and_rerun["root"]), "--reps", "50", "--out", str(out)]) == 0
    data = json.loads((out / "report.json").read_text())
    assert list(data["methods"]) == ["sac", "spectral"] and data["final_x"] == 600
    assert all(m["seeds"] == [0, 1] and m["n_tasks"] == 1 for m in data["methods"].values())
    assert any("bad/s0 (failed: error: unknown config key" in n for n in data["notes"])


def test_a_changed_sweep_file_is_refused_but_new_seeds_are_added(killed_and_rerun, capsys):
    cfg, tmp, root = killed_and_rerun["cfg"], killed_and_rerun["tmp"], killed_and_rerun["root"]
    before = snapshot(root)
    assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp), "base.total_steps=400"]) == 2
    assert "holds a sweep with a different 'base'" in capsys.readouterr().err
    assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp), "methods.sac.critic.lr=1e-3"]) == 2
    assert "method 'sac' has other overrides" in capsys.readouterr().err
    assert snapshot(root) == before
    assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp), "--dry-run", "seeds=[0, 1, 2]"]) == 0
    out = capsys.readouterr().out
    assert "sac/s2" in out and "pending" in out and "done" in out and "invalid" in out
    assert snapshot(root) == before  # a dry run writes nothing


def test_ctrl_c_stops_running_trials_at_a_checkpoint(tmp_path, local_ray, capsys):
    data = {**TINY, "methods": {"sac": TINY["methods"]["sac"]}, "seeds": [0]}
    data["base"] = {**TINY["base"], "total_steps": 100_000, "compile": False}
    cfg = write_sweep(tmp_path / "long.yaml", data)
    root = tmp_path / "long"

    def interrupt() -> None:
        while not (root / "sac/s0" / CHECKPOINT).is_file():
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp_path), "--no-progress"]) == 128 + signal.SIGINT
    assert "sweep stopped: 1 unfinished trial(s) keep their checkpoints" in capsys.readouterr().err
    entry = status(root)["trials"]["sac/s0"]
    assert entry["status"] == "pending"
    assert "stopped at step" in (root / entry["log"]).read_text()
    assert 100 <= load_checkpoint(root / "sac/s0" / CHECKPOINT)["step"] < 100_000


def test_grid_and_seed_packing_name_the_trials(tmp_path):
    data = {"kind": "train", "base": {"total_steps": 1000}, "methods": {"rr": {"critic.lr": 1e-4}},
            "grid": {"env": ["dmc:cheetah-run", "dmc:walker-walk"], "replay_ratio": [1, 32]},
            "seeds": [0, 1, 2, 3, 4], "seeds_per_trial": 2}
    s = spec.load_sweep(str(write_sweep(tmp_path / "g.yaml", data)), [])
    ids = [t.id for t in s.trials]
    assert ids[:3] == ["rr/dmc-cheetah-run/replay_ratio=1/s0-1", "rr/dmc-cheetah-run/replay_ratio=1/s2-3",
                       "rr/dmc-cheetah-run/replay_ratio=1/s4"]
    assert len(ids) == 12
    assert s.trials[1].overrides == ["critic.lr=0.0001", "env=dmc:cheetah-run", "replay_ratio=1", "seed=2",
                                     "num_seeds=2"]
    grouped = spec.load_sweep(str(tmp_path / "g.yaml"), ["seeds=[0, 1, 2]", "seeds_per_trial=3"])
    assert grouped.trials[0].seeds == [0, 1, 2]


@pytest.mark.parametrize(
    "data, overrides, fragment",
    [
        ({"kind": "rl"}, [], "kind: 'rl' is not one of continual, train"),
        ({"methodz": {}}, [], "unknown config key 'methodz' (did you mean 'methods'?)"),
        ({}, [], "methods: give at least one named override set"),
        ({"methods": {"a": {"seed": 3}}}, [], "methods.a: 'seed' is set by the sweep"),
        ({"methods": {"a": {}}, "grid": {"env": "dmc:cheetah-run"}}, [], "grid.env: expected a non-empty list"),
        ({"methods": {"a": {}}, "seeds": [0, 2]}, ["seeds_per_trial=2"], "must be consecutive"),
        ({"kind": "continual", "methods": {"a": {}}}, ["seeds_per_trial=2"], "continual runs train one seed each"),
        ({"methods": {"a/b": {}}}, [], "'a/b' must be a plain name"),
        ({"methods": {"a": {}}, "base": "no_such.yaml"}, [], "config file 'no_such.yaml' does not exist"),
    ],
)
def test_bad_sweep_files_are_one_line_errors(tmp_path, capsys, data, overrides, fragment):
    cfg = write_sweep(tmp_path / "bad.yaml", data)
    assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp_path / "out"), *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and fragment in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_error_line_names_why_a_trial_failed(tmp_path):
    log = tmp_path / "t.log"
    log.write_text("=== old attempt\nerror: old\n")
    start = log.stat().st_size
    with log.open("a") as f:
        f.write("=== new attempt\nTraceback (most recent call last):\n  File x\nRuntimeError: boom\n")
    assert error_line(log, start, 1) == "RuntimeError: boom (exit code 1)"
    assert error_line(log, start, -signal.SIGKILL) == "killed by SIGKILL"
    with log.open("a") as f:
        f.write("error: env: unknown environment\n")
    assert error_line(log, start, 2) == "error: env: unknown environment"


def test_resolved_sweep_file_runs_the_same_trials(killed_and_rerun):
    root = killed_and_rerun["root"]
    again = spec.load_sweep(str(root / "sweep.yaml"), [])
    original = spec.load_sweep(str(killed_and_rerun["cfg"]), [])
    assert again.cfg.name == "tiny"
    assert [(t.id, t.overrides) for t in again.trials] == [(t.id, t.overrides) for t in original.trials]
    with pytest.raises(ConfigError, match="different 'kind'"):
        spec.check_compatible(spec.load_sweep(str(root / "sweep.yaml"), ["kind=continual"]),
                               yaml.safe_load((root / "sweep.yaml").read_text()), root)


def test_primacy_bias_methods_are_the_run_configs_of_the_same_names():
    from sac_spectral.apps.rl.train import TrainConfig
    from sac_spectral.core.config import load_config, to_dict

    s = spec.load_sweep(str(ROOT / "run_configs/sweeps/primacy_bias.yaml"), [])
    assert len(s.trials) == 14 * 10 and all(t.seeds == list(range(10)) for t in s.trials)
    files = {"sac_rr1": "sac", "sac_rr32": "sac"}
    for method in s.methods:
        trial = next(t for t in s.trials if t.method == method and t.point["env"] == "dmc:cheetah-run")
        ours = to_dict(merge_sources(TrainConfig, s.base, [*trial.overrides, "device=cpu", "num_seeds=1"]))
        theirs = to_dict(load_config(TrainConfig, ROOT / f"run_configs/primacy_bias_{files.get(method, method)}.yaml"))
        if method == "sac_rr1":
            theirs["replay_ratio"] = 1.0
        assert ({k: v for k, v in ours.items() if k != "device"}
                == {k: v for k, v in theirs.items() if k != "device"}), method


def test_plasticity_sweep_is_the_readme_table():
    s = spec.load_sweep(str(ROOT / "run_configs/sweeps/plasticity_continual.yaml"), [])
    assert s.cfg.kind == "continual" and s.cfg.seeds == [0, 1, 2] and len(s.trials) == 13 * 3
    assert s.trials[0].id == "plain/s0"  # the unregularized baseline; `--baseline none` would read as no baseline
    assert "seed" not in s.base and s.base["stream"]["num_tasks"] == 30
    assert spec.invalid_trials(s) == {}


def test_priming_methods_are_the_run_configs_of_the_same_names():
    from sac_spectral.apps.rl.train import TrainConfig
    from sac_spectral.core.config import load_config, merge_sources, to_dict

    s = spec.load_sweep(str(ROOT / "run_configs/sweeps/priming_cpu.yaml"), [])
    assert [t.id for t in s.trials] == ["sac/s0-4", "unprimed/s0-4", "resets_after_priming/s0-4", "spectral/s0-4",
                                        "resets/s0-4"]
    for trial in (t for t in s.trials if t.method != "resets_after_priming"):
        ours = to_dict(merge_sources(TrainConfig, s.base, [*trial.overrides, "num_seeds=1"]))
        theirs = to_dict(load_config(TrainConfig,
                                     ROOT / f"run_configs/priming_{trial.method.replace('unprimed', 'sac')}.yaml"))
        if trial.method == "unprimed":
            assert theirs["priming"]["updates"] > 0
            theirs["priming"]["updates"] = 0
        assert ours == theirs, trial.method


def test_the_priming_toolbox_sweeps_resolve_every_arm_on_the_shared_protocol():
    """The toolbox arms are the primed protocol with one change each (their trials are valid run
    configs, the same 5 seeds, and only the named keys differ from primed SAC)."""
    s = spec.load_sweep(str(ROOT / "run_configs/sweeps/priming_methods.yaml"), [])
    a = spec.load_sweep(str(ROOT / "run_configs/sweeps/priming_archs.yaml"), [])
    assert [t.method for t in s.trials + a.trials] == ["layer_norm", "nap", "cbp", "plasticity_injection", "redo",
                                                      "shrink_perturb", "bronet", "simba"]
    assert spec.invalid_trials(s) == {} and spec.invalid_trials(a) == {}
    assert all(t.seeds == [0, 1, 2, 3, 4] for t in s.trials + a.trials)
    assert s.base == a.base == spec.load_sweep(str(ROOT / "run_configs/sweeps/priming_cpu.yaml"), []).base


def test_cost_model_measures_each_agent_config_once(bf16_configs):
    """The dry run's cached update time is keyed on the resolved agent config: fp32 and bf16 (or
    compiled) trials are timed separately; trials that differ only in seed or length share one."""
    from sac_spectral.apps.rl.cost import estimate_cost, update_key
    from sac_spectral.apps.rl.train import TrainConfig
    from sac_spectral.studies.cost import CostModel

    small = ["env=dmc:cartpole-balance", "batch_size=8", "actor.hidden=[8]", "critic.hidden=[8]", "total_steps=50",
             "eval_every=0", "eval_episodes=1"]
    cfg = merge_sources(TrainConfig, {}, small)
    keys = {json.dumps(update_key(merge_sources(TrainConfig, {}, [*small, *o]), 5, 1), sort_keys=True)
            for o in ([], ["seed=3", "total_steps=99"], ["precision=bf16"], ["compile=true"], ["critic.hidden=[16]"])}
    assert len(keys) == 4
    model = CostModel(threads=1)
    updates, _ = estimate_cost(cfg, model)
    assert updates == cfg.total_updates
    estimate_cost(merge_sources(TrainConfig, {}, [*small, "seed=4"]), model)
    n = len(model.cache)
    estimate_cost(merge_sources(TrainConfig, {}, [*small, "precision=bf16"]), model)
    assert len(model.cache) == n + 1
