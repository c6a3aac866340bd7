"""The harness of the bad-input suite (``tests/test_bad_inputs.py``): run the real command-line
tools as subprocesses in a scratch workspace and check that they behave as promised.

An attack returns the problems it found (an empty list when the tool behaved). A problem is a
traceback, a wrong exit code (2 bad input; 1 non-finite, disk full, I/O failure; 128 + signal),
silent corruption (a non-finite or unreadable checkpoint), a lost or overwritten file, or a
missing / misleading one-line ``error:`` message.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sac_spectral.runs.layout import CHECKPOINT

ROOT = Path(__file__).resolve().parents[1]
CKPT = CHECKPOINT
#: a tiny RL run
RL = [
    "env=dmc:cartpole-balance", "random_steps=50", "eval_episodes=1", "eval_every=0", "diagnostics.every=0",
    "threads=1", "progress=false", "actor.hidden=[32, 32]", "critic.hidden=[32, 32]", "batch_size=32",
    "buffer_size=2000", "log_every=50",
]
#: a tiny continual run
CL = [
    "progress=false", "threads=1", "model.width=32", "batch_size=16", "log_every=10", "stream.num_tasks=2",
    "stream.iters_per_task=30", "stream.subset=100",
]
AS_ROOT = os.geteuid() == 0
#: the finished runs attacks copy: key → the command that makes it
FIXTURES = {
    "R": ["-m", "sac_spectral.train", *RL, "total_steps=150", "checkpoint_every=50"],
    "R_wide": ["-m", "sac_spectral.train", *RL, "total_steps=100", "actor.hidden=[48, 48]", "critic.hidden=[48, 48]"],
    "RC": ["-m", "sac_spectral.continual", *CL],
}


@dataclass
class Proc:
    """A finished subprocess."""

    args: list[str]
    rc: int
    out: str
    err: str

    def show(self) -> str:
        tail = self.err.strip().splitlines()[-3:]
        return f"rc={self.rc}; stderr tail: {' | '.join(tail)[:300]}"


@dataclass
class Attack:
    """One attack: a function of the workspace returning its problems."""

    name: str
    fn: Callable[[Ctx], list[str]]


@dataclass
class Ctx:
    """The workspace of the suite: finished runs to copy (made on first use) and helpers."""

    ws: Path
    runs: dict[str, Path] = field(default_factory=dict)
    _n: int = 0

    def path(self, name: str) -> Path:
        """A fresh path in the workspace (nothing created)."""
        self._n += 1
        return self.ws / f"{self._n:03d}_{name}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        env.pop("PYTHONWARNINGS", None)
        return env

    def popen(self, argv: Sequence[object], fsize: int | None = None, cwd: Path | None = None) -> subprocess.Popen:
        """Start ``python ARGV`` (with a file-size limit of ``fsize`` bytes if given)."""
        def limit() -> None:
            if fsize is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

        return subprocess.Popen(
            [sys.executable, *map(str, argv)], cwd=cwd or self.ws, env=self.env(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, errors="replace", preexec_fn=limit,
        )

    def run(self, argv: Sequence[object], fsize: int | None = None, cwd: Path | None = None,
            timeout: float = 600) -> Proc:
        """Run ``python ARGV`` to its end (killed after ``timeout`` seconds)."""
        p = self.popen(argv, fsize, cwd)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            err += "\n[attack: timed out]"
        return Proc([str(a) for a in argv], p.returncode, out, err)

    def T(self, *args: object, **kw: object) -> Proc:
        return self.run(["-m", "sac_spectral.train", *args], **kw)  # type: ignore[arg-type]

    def C(self, *args: object, **kw: object) -> Proc:
        return self.run(["-m", "sac_spectral.continual", *args], **kw)  # type: ignore[arg-type]

    def D(self, *args: object, **kw: object) -> Proc:
        return self.run(["-m", "sac_spectral.diagnose", *args], **kw)  # type: ignore[arg-type]

    def fixture(self, key: str) -> Path:
        """The finished run ``key`` of :data:`FIXTURES` (made on first use; do not modify it)."""
        if key not in self.runs:
            rd = self.ws / f"fixture_{key}"
            p = self.run([*FIXTURES[key], f"run_dir={rd}"])
            if p.rc != 0:
                raise RuntimeError(f"fixture {key} failed: {p.show()}")
            self.runs[key] = rd
        return self.runs[key]

    def copy(self, which: str, name: str) -> Path:
        """A copy of the finished run ``which`` to modify."""
        dst = self.path(name)
        shutil.copytree(self.fixture(which), dst)
        return dst


def traceback_in(p: Proc) -> bool:
    return "Traceback (most recent call last)" in p.err or "Traceback (most recent call last)" in p.out


def error_lines(p: Proc) -> list[str]:
    return [ln for ln in p.err.splitlines() if ln.startswith("error:")]


def expect_error(p: Proc, code: int, *fragments: str | tuple[str, ...]) -> list[str]:
    """Exit ``code``, no traceback, exactly one ``error:`` line holding every fragment (a tuple:
    any of its words), and no advice to load unsafely."""
    problems = []
    if traceback_in(p):
        problems.append("traceback")
    if p.rc != code:
        problems.append(f"exit code {p.rc}, expected {code}")
    lines = error_lines(p)
    if len(lines) != 1:
        problems.append(f"{len(lines)} 'error:' lines, expected one")
    else:
        low = lines[0].lower()
        for frag in fragments:
            alts = (frag,) if isinstance(frag, str) else frag
            if not any(a.lower() in low for a in alts):
                problems.append(f"message lacks {' / '.join(alts)!r}: {lines[0][:300]}")
    if "weights_only=False" in p.err or "weights_only` to `False`" in p.err:
        problems.append("suggests unsafe loading (weights_only=False)")
    if problems and (len(lines) != 1 or p.rc != code):
        problems.append(f"[{p.show()}]")
    return problems


def expect_ok(p: Proc, code: int = 0) -> list[str]:
    """Exit ``code`` without a traceback."""
    problems = []
    if traceback_in(p):
        problems.append("traceback")
    if p.rc != code:
        problems.append(f"exit code {p.rc}, expected {code}")
    return problems + ([f"[{p.show()}]"] if problems else [])


def snapshot(*paths: Path) -> dict[str, str]:
    """Content hash of every file under ``paths`` (and which paths exist)."""
    out: dict[str, str] = {}
    for root in paths:
        if not root.exists():
            continue
        for p in [root, *root.rglob("*")] if root.is_dir() else [root]:
            out[str(p)] = hashlib.sha1(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def unchanged(before: dict[str, str], *paths: Path) -> list[str]:
    after = snapshot(*paths)
    if after == before:
        return []
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return [f"files changed: {', '.join(Path(c).name for c in changed[:5])}"]


def nonfinite_tensors(x: object, where: str = "") -> list[str]:
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() and not torch.isfinite(x).all():
            return [f"{where} ({int((~torch.isfinite(x)).sum())} non-finite)"]
        return []
    if isinstance(x, dict):
        return [w for k, v in x.items() for w in nonfinite_tensors(v, f"{where}.{k}")]
    if isinstance(x, (list, tuple)):
        return [w for i, v in enumerate(x) for w in nonfinite_tensors(v, f"{where}[{i}]")]
    return []


def checkpoint_sound(path: Path) -> tuple[list[str], dict | None]:
    """The checkpoint loads safely and every floating tensor in it is finite."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - anything unreadable is the finding
        return [f"checkpoint {path} unreadable: {str(err).splitlines()[0][:120]}"], None
    bad = nonfinite_tensors(state)
    return ([f"non-finite values in the checkpoint: {', '.join(bad[:3])}"] if bad else []), state


def temp_files(run_dir: Path) -> list[Path]:
    return list(run_dir.rglob(".*.tmp"))


def unwritable_dir(ctx: Ctx, name: str) -> Path:
    """A directory path nothing can be created in: under a regular file (chmod does not stop root)."""
    if AS_ROOT:
        blocker = ctx.path(f"{name}_file")
        blocker.write_text("a regular file\n")
        return blocker / "sub"
    d = ctx.path(f"{name}_ro")
    d.mkdir()
    d.chmod(0o555)
    return d / "sub"
