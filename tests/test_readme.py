"""The Python snippets of README.md and of every docs/*.md page run as pasted (each in a fresh
namespace, in a scratch directory). Blocks fenced as ```python run; illustrations use another fence."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sac_spectral.agents import AGENTS
from sac_spectral.regularizers.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    (f"{page.relative_to(ROOT).as_posix()} python block {i + 1}", code)
    for page in PAGES
    for i, code in enumerate(re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M))
]


def test_the_readme_and_docs_have_python_snippets():
    assert len(BLOCKS) >= 5
    assert any(name.startswith("README.md") for name, _ in BLOCKS)


#: what shortens the quick run for the test (the README's command runs 10 000 steps)
SHORT = ["total_steps=200", "random_steps=100", "eval_every=100", "eval_episodes=1", "progress=false"]
QUICK_RUN = "runs/quick"


def quick_tour_commands() -> list[list[str]]:
    """The ``python -m`` lines of the README's first bash block (the quick tour's loop)."""
    block = re.search(r"## Quick tour.*?^```bash\n(.*?)^```", (ROOT / "README.md").read_text(encoding="utf-8"),
                      flags=re.S | re.M).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.startswith("python -m")]


@pytest.fixture(scope="module")
def quick_tour(tmp_path_factory) -> Path:
    """A scratch directory where the quick tour's commands ran as pasted (the run shortened)."""
    where = tmp_path_factory.mktemp("tour")
    (where / "run_configs").symlink_to(ROOT / "run_configs")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("MUJOCO_GL", None)
    for argv in quick_tour_commands():
        extra = SHORT if argv[2] == "sac_spectral.train" else []
        out = subprocess.run([sys.executable, *argv[1:], *extra], cwd=where, env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, f"{shlex.join(argv)}: {out.stderr}"
    return where


def test_the_quick_tour_trains_plays_and_writes_a_video(quick_tour):
    assert [argv[2] for argv in quick_tour_commands()] == ["sac_spectral.train", "sac_spectral.play"]
    assert (quick_tour / QUICK_RUN / "summary.json").is_file()
    video = quick_tour / "quick.mp4"
    assert video.stat().st_size > 1000 and video.read_bytes()[4:8] == b"ftyp"


@pytest.mark.parametrize("name, code", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_snippet_runs(name, code, tmp_path, monkeypatch, request):
    monkeypatch.chdir(tmp_path)
    if QUICK_RUN in code:  # the quick tour's snippet loads the run its commands made
        (tmp_path / "runs").symlink_to(request.getfixturevalue("quick_tour") / "runs")
    registered, agents = dict(REGISTRY), dict(AGENTS)
    try:
        exec(compile(code, name, "exec"), {"__name__": "readme"})
    finally:  # a snippet that registers an example method or agent leaves no trace
        REGISTRY.clear()
        REGISTRY.update(registered)
        AGENTS.clear()
        AGENTS.update(agents)
