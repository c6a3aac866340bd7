"""The documentation builds with `mkdocs build --strict` (no broken links or anchors, every page
in the nav), and README.md stays a front page that gives the two commands."""

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INSTALL = 'pip install torch==2.13.0 && pip install -e ".[dev]"'
TRAIN = f"{INSTALL} && python -m sac_spectral.train"
TEST = f"{INSTALL} && python -m pytest"  # CI (.ci/run) runs exactly `python -m pytest`


def test_mkdocs_build_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _nav_files(entries):
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            yield from _nav_files(value)
        else:
            yield value


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert set(_nav_files(config["nav"])) == pages


def test_readme_is_a_front_page_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move details to docs/"
    assert TRAIN in lines
    assert TEST in lines
