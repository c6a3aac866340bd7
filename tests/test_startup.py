"""A run's start: what importing the runner and ``--help`` load, the config line before the heavy
imports and the build, and ``compile: auto`` (its parsing, its decision, and that a run keeps its choice)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from sac_spectral.agents import engine
from sac_spectral.apps.rl import compile_choice
from sac_spectral.apps.rl.compile_choice import (
    AUTO_MIN_UPDATES,
    CACHED_MIN_UPDATES,
    auto_compile,
    compiled_before,
    program_key,
    remember_compiled,
    resolve_compile,
)
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.apps.rl.train import main
from sac_spectral.core.config import ConfigError, load_config
from sac_spectral.runs.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
#: what the runner's import and --help must not load: simulators, TensorBoard, plotting, the studies layer
LAZY = ("dm_control", "mujoco", "shimmy", "tensorboard", "matplotlib", "ray", "rliable", "pandas",
        "sac_spectral.studies", "torch._inductor")
TINY = ["env=dmc:cartpole-balance", "random_steps=20", "total_steps=30", "eval_every=0", "eval_episodes=1",
        "batch_size=8", "actor.hidden=[8,8]", "critic.hidden=[8,8]", "threads=1", "progress=false",
        "diagnostics.every=0", "checkpoint_every=0"]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _loaded(code: str) -> list[str]:
    """The :data:`LAZY` modules loaded after ``code`` ran in a fresh interpreter."""
    proc = _python(f"import sys\n{code}\nprint(sorted(m for m in {LAZY!r} if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    return eval(proc.stdout.strip().splitlines()[-1])


def test_importing_the_runner_loads_no_simulator_tensorboard_plotting_or_studies():
    assert _loaded("import sac_spectral.train") == []


def test_help_loads_no_simulator_tensorboard_plotting_or_studies():
    code = ("import runpy\nsys.argv = ['sac_spectral.train', '--help']\ntry:\n"
            "    runpy.run_module('sac_spectral.train', run_name='__main__')\nexcept SystemExit:\n    pass")
    assert _loaded(code) == []


def test_a_fresh_run_says_what_it_runs_before_it_loads_the_simulator_and_builds(tmp_path):
    """The config line is the run's first, written before dm_control, TensorBoard and torch's
    compiler stack (which any torch optimizer imports) are loaded; the run directory follows."""
    args = [*TINY, f"run_dir={tmp_path / 'run'}"]
    spy = (
        "class Spy:\n"
        "    def __init__(self, f): self.f = f\n"
        "    def write(self, text):\n"
        "        if text.startswith('config: '):\n"
        "            heavy = ('dm_control', 'mujoco', 'tensorboard', 'torch._dynamo')\n"
        "            print('LOADED', sorted(m for m in heavy if m in sys.modules), file=sys.__stdout__, flush=True)\n"
        "        return self.f.write(text)\n"
        "    def __getattr__(self, name): return getattr(self.f, name)\n"
        "sys.stderr = Spy(sys.stderr)\n"
        "from sac_spectral.apps.rl.train import main\n"
        f"sys.exit(main({args!r}))"
    )
    proc = _python(f"import sys\n{spy}")
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout, proc.stdout
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("config: sac | dmc:cartpole-balance | seed 0 | 30 steps"), lines
    assert lines[1].startswith("compile: auto → eager (10 updates are fewer than"), lines
    assert lines[2] == f"run directory: {tmp_path / 'run'}", lines


@pytest.mark.parametrize(("value", "parsed"), [("auto", "auto"), ("true", True), ("false", False)])
def test_compile_takes_true_false_or_auto(value, parsed):
    assert load_config(TrainConfig, overrides=[f"compile={value}"]).compile == parsed


def test_compile_is_auto_by_default_and_a_bad_value_names_the_choices():
    assert TrainConfig().compile == "auto"
    with pytest.raises(ConfigError, match=r"^compile: expected true \| false \| 'auto', got 'maybe'$"):
        load_config(TrainConfig, overrides=["compile=maybe"])


def test_auto_is_valid_for_an_agent_without_a_compiled_update_and_chooses_eager():
    cfg = load_config(TrainConfig, overrides=["agent=crossq", "total_steps=1000000"])
    assert auto_compile(cfg, torch.device("cpu"), compiler=_never, kernels=_never) == (
        False, "agent 'crossq' has no compiled update")
    with pytest.raises(ConfigError, match="agent 'crossq' has no compiled update"):
        load_config(TrainConfig, overrides=["agent=crossq", "compile=true"])


def _never() -> str | None:
    raise AssertionError("consulted")


def _present() -> str | None:
    return None


def _long(updates: int) -> TrainConfig:
    """The default run with ``updates`` updates (replay ratio 1 after the default random steps)."""
    cfg = TrainConfig()
    cfg.total_steps = cfg.random_steps + updates
    assert cfg.total_updates == updates
    return cfg


def test_auto_compiles_a_long_run_on_a_cpu_with_a_compiler_and_the_kernels():
    for updates in (AUTO_MIN_UPDATES, 10 * AUTO_MIN_UPDATES):
        assert auto_compile(_long(updates), torch.device("cpu"), compiler=_present, kernels=_present)[0] is True


def test_auto_runs_a_short_run_eager_without_looking_for_a_compiler():
    compiled, why = auto_compile(_long(AUTO_MIN_UPDATES - 1), torch.device("cpu"), compiler=_never, kernels=_never)
    assert compiled is False and why.startswith(f"{AUTO_MIN_UPDATES - 1} updates are fewer than the {AUTO_MIN_UPDATES}")


def test_auto_runs_eager_without_a_compiler_or_the_kernels_and_says_why():
    cfg = _long(2 * AUTO_MIN_UPDATES)
    assert auto_compile(cfg, torch.device("cpu"), compiler=lambda: "tried 'g++'", kernels=_never) == (
        False, "no C++ compiler (tried 'g++')")
    assert auto_compile(cfg, torch.device("cpu"), compiler=_present, kernels=lambda: "no oneDNN") == (
        False, "the C++ kernels are unavailable (no oneDNN)")
    assert auto_compile(cfg, torch.device("cuda"), compiler=_never, kernels=_never)[0] is False


def test_auto_compiles_a_shorter_run_whose_programs_an_earlier_run_left_in_the_cache():
    updates = (CACHED_MIN_UPDATES + AUTO_MIN_UPDATES) // 2
    assert CACHED_MIN_UPDATES < updates < AUTO_MIN_UPDATES
    assert auto_compile(_long(updates), torch.device("cpu"), compiler=_never, kernels=_never)[0] is False
    compiled, why = auto_compile(_long(updates), torch.device("cpu"), compiler=_present, kernels=_present, cached=True)
    assert compiled is True and why.startswith(f"{updates} updates: a compile from the cache pays for itself after "
                                               f"{CACHED_MIN_UPDATES}")
    compiled, why = auto_compile(_long(CACHED_MIN_UPDATES - 1), torch.device("cpu"), compiler=_never, kernels=_never,
                                 cached=True)
    assert compiled is False and "after which a compile from the cache has paid for itself" in why


@pytest.mark.usefixtures("bf16_configs")
def test_the_program_key_ignores_run_options_and_follows_what_shapes_the_update():
    base = program_key(TrainConfig(), 17, 6)
    same = load_config(TrainConfig, overrides=["seed=3", "total_steps=5000", "eval_episodes=1", "run_dir=x",
                                               "env=dmc:walker-run", "priming.updates=10",
                                               "priming.transitions=5"])
    assert program_key(same, 17, 6) == base
    for change in (["num_seeds=2"], ["batch_size=128"], ["threads=1"], ["critic.hidden=[64, 64]"],
                   ["critic.regularizers=[{name: spectral}]"], ["precision=bf16"], ["agent=redq"]):
        assert program_key(load_config(TrainConfig, overrides=change), 17, 6) != base, change
    assert program_key(TrainConfig(), 24, 6) != base and program_key(TrainConfig(), 17, 2) != base


def test_a_finished_compiled_run_is_remembered_in_inductor_s_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    key = program_key(TrainConfig(), 17, 6)
    assert not compiled_before(key)
    remember_compiled(key)
    assert compiled_before(key) and not compiled_before(program_key(TrainConfig(), 17, 5))
    assert (tmp_path / "inductor").is_dir()


def test_a_run_that_finished_compiled_is_found_by_the_next_run_with_its_programs(tmp_path, monkeypatch, capsys):
    """The runner remembers a compiled run once it finished its updates, and a later ``auto`` run with
    the same programs (another seed and length) is told so; an eager run is not remembered."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(engine, "Compiled", lambda agent, *args, **kwargs: engine.Eager(agent))  # no compile here
    monkeypatch.setattr(compile_choice, "auto_compile", lambda cfg, device, cached: (False, f"cached: {cached}"))

    def choice(*overrides: str) -> list[str]:
        assert run_cli(main, [*TINY, *overrides]) == 0
        return [line for line in capsys.readouterr().err.splitlines() if line.startswith("compile: auto")]

    assert choice(f"run_dir={tmp_path / 'eager'}") == ["compile: auto → eager (cached: False)"]
    assert choice(f"run_dir={tmp_path / 'again'}") == ["compile: auto → eager (cached: False)"]
    assert choice(f"run_dir={tmp_path / 'compiled'}", "compile=true") == []
    later = choice(f"run_dir={tmp_path / 'later'}", "seed=5", "total_steps=40")
    assert later == ["compile: auto → eager (cached: True)"]
    assert choice(f"run_dir={tmp_path / 'other'}", "critic.hidden=[8]") == ["compile: auto → eager (cached: False)"]


def test_the_run_config_holds_the_resolved_choice(monkeypatch):
    monkeypatch.setattr(compile_choice, "auto_compile", lambda cfg, device, cached: (True, "a reason"))
    cfg = TrainConfig()
    assert resolve_compile(cfg, torch.device("cpu")) == ("compile: auto → compiled (a reason)", None)
    assert cfg.compile is True
    cfg = load_config(TrainConfig, overrides=["compile=false"])
    assert resolve_compile(cfg, torch.device("cpu")) == (None, None) and cfg.compile is False


def test_resume_keeps_the_run_s_choice_unless_compile_is_given(tmp_path, capsys, monkeypatch):
    """A run's config.yaml records what auto chose; a resume does not decide again (auto is not
    consulted) unless ``compile`` is given on the command line."""
    rd = tmp_path / "run"
    assert run_cli(main, [*TINY, f"run_dir={rd}"]) == 0
    assert "compile: auto → eager" in capsys.readouterr().err
    assert yaml.safe_load((rd / "config.yaml").read_text())["compile"] is False
    monkeypatch.setattr(compile_choice, "auto_compile", lambda cfg, device, cached: _never())
    assert run_cli(main, ["--resume", str(rd), "total_steps=40"]) == 0
    assert "compile:" not in capsys.readouterr().err
    assert yaml.safe_load((rd / "config.yaml").read_text())["compile"] is False
    monkeypatch.setattr(compile_choice, "auto_compile", lambda cfg, device, cached: (False, "asked again"))
    assert run_cli(main, ["--resume", str(rd), "total_steps=50", "compile=auto"]) == 0
    assert "compile: auto → eager (asked again)" in capsys.readouterr().err.splitlines()
    assert yaml.safe_load((rd / "config.yaml").read_text())["compile"] is False
    assert json.loads((rd / "summary.json").read_text())["steps"] == 50
