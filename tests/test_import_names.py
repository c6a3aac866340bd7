"""Every import name the distribution installs lies under ``sac_spectral.``: the runners work from a
project folder that has its own ``agents`` and ``envs`` packages (as many RL repositories do)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _user_project(tmp_path: Path) -> Path:
    """A folder with its own ``agents/`` and ``envs/`` packages that lack every name we use."""
    for name in ("agents", "envs"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"WHO = 'the user project {name}'\n")
    return tmp_path


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(cwd)}
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_distribution_installs_only_sac_spectral():
    assert 'include = ["sac_spectral*"]' in (ROOT / "pyproject.toml").read_text()
    assert not (ROOT / "agents").exists() and not (ROOT / "envs").exists()


def test_train_runs_from_a_folder_with_its_own_agents_and_envs_packages(tmp_path):
    cwd = _user_project(tmp_path)
    help_ = _run(["-m", "sac_spectral.train", "--help"], cwd)
    assert help_.returncode == 0, help_.stderr
    assert "total_steps" in help_.stdout
    run = _run(["-m", "sac_spectral.train", "env=dmc:cartpole-balance", "total_steps=300", "random_steps=100",
                "eval_every=300", "eval_episodes=1", "actor.hidden=[16]", "critic.hidden=[16]", "batch_size=16",
                "progress=false", "threads=1", "run_dir=r"], cwd)
    assert run.returncode == 0, run.stderr
    assert json.loads((cwd / "r" / "summary.json").read_text())["steps"] == 300
    probe = _run(["-c", "import agents, envs, sac_spectral.agents, sac_spectral.envs; print(agents.WHO, envs.WHO)"],
                 cwd)
    assert probe.stdout.strip() == "the user project agents the user project envs"
