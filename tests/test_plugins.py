"""Plug-ins on the path, as a user installs them (a ``*.dist-info`` with ``entry_points.txt`` beside
its module): a broken one costs only itself (one warning line; an error only where its kind is asked
for), and none replaces a built-in run kind."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sac_spectral.core.plugins import load_entry_points

ROOT = Path(__file__).resolve().parents[1]
RL_COLUMNS = "step,seed,updates,return,episodes,wall_time_s"
#: a working plug-in beside the broken ones: a run kind whose dry run has nothing to measure
COIN = """
import dataclasses
from sac_spectral.runs.kinds import RunKind

@dataclasses.dataclass
class Config:
    seed: int = 0
    threads: int = 1
    device: str = "cpu"
    flips: int = 10

def cost(cfg, model):
    return cfg.flips, 0.5 * cfg.flips

KIND = RunKind(name="coin", runner="coin_kind", title="coin flips", config="coin_kind:Config", cost="coin_kind:cost",
               unit="flips", columns=("round", "seed", "heads"), x="round", x_label="round", score="heads",
               score_label="heads", raw_label="heads", test=None, task_keys=("coin",), window=1, members=False,
               scale=lambda config: None, history=lambda summary: [], names_run=lambda summary, config: True)
"""
COIN_SWEEP = {"kind": "coin", "base": {"flips": 10}, "methods": {"fair": {}}, "seeds": [0]}
#: entry point -> (what it names, the error it ends in): an import that raises, a module that is not
#: there, an object that is not a RunKind
BROKEN = {
    "raises": ("raising_mod:KIND", "RuntimeError: no licence server"),
    "missing": ("not_there:KIND", "ModuleNotFoundError: No module named 'not_there'"),
    "notkind": ("dict_mod:KIND", "TypeError: register_kind expects a RunKind, got dict"),
}


def install(path: Path, package: str, entry_points: str, modules: dict[str, str]) -> Path:
    """A distribution ``package`` 0.1 under ``path``: its metadata, ``entry_points.txt`` and modules."""
    info = path / f"{package}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    for name, source in modules.items():
        (path / f"{name}.py").write_text(source)
    return path


def run(plugins: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m ARGS`` with ``plugins`` on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def rl_runs(root: Path) -> Path:
    """Two loose RL runs (seeds 0 and 1) with three evaluations each."""
    for seed in (0, 1):
        run_dir = root / f"s{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump({"env": "dmc:cheetah-run", "seed": seed}))
        rows = [f"{step},{seed},{step},{step / 10 + seed},1,0.0" for step in (1000, 2000, 3000)]
        (run_dir / "evals.csv").write_text("\n".join([RL_COLUMNS, *rows]) + "\n")
    return root


@pytest.fixture
def broken(tmp_path) -> Path:
    """A path holding ``brokenpkg``, which declares the run kinds of :data:`BROKEN`, and ``coinpkg``."""
    plugins = tmp_path / "plugins"
    install(plugins, "coinpkg", "[sac_spectral.run_kinds]\ncoin = coin_kind:KIND\n", {"coin_kind": COIN})
    points = "".join(f"{name} = {target}\n" for name, (target, _) in BROKEN.items())
    return install(plugins, "brokenpkg", f"[sac_spectral.run_kinds]\n{points}",
                   {"raising_mod": "raise RuntimeError('no licence server')", "dict_mod": "KIND = {'name': 'notkind'}"})


def assert_one_warning_each(stderr: str) -> None:
    """One warning line per broken entry point, naming it, its package and its error; no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if "sac_spectral.run_kinds" in line]
    assert len(lines) == len(BROKEN), stderr
    for name, (target, error) in BROKEN.items():
        line = next(line for line in lines if f"'{name}'" in line)
        assert line.startswith("warning: ") and f"{target} (package brokenpkg 0.1)" in line and error in line, line


def test_broken_plugins_are_one_warning_each_and_the_report_runs(broken, tmp_path):
    done = run(broken, tmp_path, "sac_spectral.report", str(rl_runs(tmp_path / "runs")), "--out", "out", "--reps", "20")
    assert done.returncode == 0, done.stderr
    assert_one_warning_each(done.stderr)
    assert (tmp_path / "out" / "report.md").is_file()


def test_broken_plugins_are_one_warning_each_and_the_sweep_dry_run_of_another_plugin_runs(broken, tmp_path):
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(COIN_SWEEP))
    done = run(broken, tmp_path, "sac_spectral.sweep", "--config", "study.yaml", "--out", "out", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "1 of 1 trials to run (0 invalid): 10 flips, ≈ 5 s" in done.stdout
    assert_one_warning_each(done.stderr)


def test_asking_for_a_broken_plugins_kind_is_a_one_line_error_that_says_why(broken, tmp_path):
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({**COIN_SWEEP, "kind": "raises"}))
    done = run(broken, tmp_path, "sac_spectral.sweep", "--config", "study.yaml", "--out", "out", "--dry-run")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    err = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert err == ["error: kind: 'raises' is unavailable: the plug-in raising_mod:KIND (package brokenpkg 0.1) is "
                   "broken: RuntimeError: no licence server"], done.stderr
    assert not (tmp_path / "out").exists()
    run_dir = tmp_path / "runs" / "r"  # a run that recorded its kind
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("# kind: notkind (the resolved config of this run)\nseed: 0\n")
    done = run(broken, tmp_path, "sac_spectral.report", str(run_dir), "--out", "report")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("error: run kind 'notkind' is unavailable: "
                           "the plug-in dict_mod:KIND (package brokenpkg 0.1)")
    assert last.endswith(BROKEN["notkind"][1])


EVIL = """
import dataclasses
from sac_spectral.apps.rl.kind import KIND as BUILT_IN

KIND = dataclasses.replace(BUILT_IN, title="EVIL", runner="evil.run")
ALIAS = dataclasses.replace(KIND, name="train")
"""


def test_a_plugin_cannot_replace_a_built_in_kind(tmp_path):
    """``train`` declared by a plug-in, directly or as a RunKind of that name under another entry
    point: the report reads the runs as the built-in kind, and each attempt is one warning line."""
    plugins = install(tmp_path / "plugins", "evil", "[sac_spectral.run_kinds]\ntrain = evil_mod:KIND\n"
                      "alias = evil_mod:ALIAS\n", {"evil_mod": EVIL})
    done = run(plugins, tmp_path, "sac_spectral.report", str(rl_runs(tmp_path / "runs")), "--out", "out", "--reps",
               "20")
    assert done.returncode == 0, done.stderr
    assert "Kind: RL (sac_spectral.train)" in (tmp_path / "out" / "report.md").read_text()
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: sac_spectral.run_kinds")]
    assert len(warnings) == 2 and "Traceback" not in done.stderr, done.stderr
    clash = next(line for line in warnings if "'train' of" in line)
    assert "evil_mod:KIND (package evil 0.1)" in clash and "built-in sac_spectral.apps.rl.kind:KIND" in clash
    alias = next(line for line in warnings if "'alias'" in line)
    assert "evil_mod:ALIAS (package evil 0.1)" in alias and "named 'train', not 'alias'" in alias


# --------------------------------------------------------------------------------- the loader itself
def test_load_entry_points_registers_what_loads_and_returns_why_the_rest_did_not(tmp_path, monkeypatch, capsys):
    """A group of another tool: ``register`` gets each object by name; an import error or a refusal
    by ``register`` is a skipped name with its reason; a name two packages declare goes to the first."""
    group = "sac_spectral_test.widgets"
    install(tmp_path, "apkg", f"[{group}]\ngood = widgets_a:GOOD\nrefused = widgets_a:BAD\nshared = widgets_a:GOOD\n",
            {"widgets_a": "GOOD, BAD = 'a good widget', 42"})
    install(tmp_path, "bpkg", f"[{group}]\nshared = widgets_b:OTHER\ngone = widgets_b:GONE\n",
            {"widgets_b": "OTHER = 'b widget'"})
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {}

    def register(name: str, obj: object) -> None:
        if not isinstance(obj, str):
            raise TypeError(f"expected a widget, got {type(obj).__name__}")
        found[name] = obj

    broken = load_entry_points(group, register)
    assert found == {"good": "a good widget", "shared": "a good widget"}
    assert set(broken) == {"refused", "gone"}
    assert "widgets_a:BAD (package apkg 0.1)" in broken["refused"]
    assert "TypeError: expected a widget, got int" in broken["refused"]
    assert "AttributeError" in broken["gone"] and "\n" not in broken["gone"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith(f"warning: {group}: ") for line in err), err
    assert any("widgets_b:OTHER (package bpkg 0.1)" in line and "widgets_a:GOOD (package apkg 0.1)" in line
               for line in err)
