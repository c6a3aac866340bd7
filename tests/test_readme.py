"""The README's Python snippets run as pasted (each in a fresh namespace, in a scratch directory)."""

import re
from pathlib import Path

import pytest

from sac_spectral.regularizers.registry import REGISTRY

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_snippets():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_snippet_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    registered = dict(REGISTRY)
    try:
        exec(compile(BLOCKS[index], f"README.md python block {index + 1}", "exec"), {"__name__": "readme"})
    finally:
        REGISTRY.clear()
        REGISTRY.update(registered)  # a snippet that registers an example method leaves no trace
