"""The Python snippets of README.md and of every docs/*.md page run as pasted (each in a fresh
namespace, in a scratch directory). Blocks fenced as ```python run; illustrations use another fence."""

import re
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("name, code", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_snippet_runs(name, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    registered = dict(REGISTRY)
    try:
        exec(compile(code, name, "exec"), {"__name__": "readme"})
    finally:
        REGISTRY.clear()
        REGISTRY.update(registered)  # a snippet that registers an example method leaves no trace
