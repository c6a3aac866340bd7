"""The native build (sac_spectral.core.native) in a build folder of each test's own: a good build
loads with no lock, compiler, ninja or write; a stale lock never hangs; a corrupted library is
rebuilt; a missing compiler is said in one line. Each load runs in a process of its own (a library
registers its kernels once per process), with a timeout, so that a hang fails."""

import hashlib
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sac_spectral.agents import compiled
from sac_spectral.core import native

ROOT = Path(__file__).resolve().parents[1]

#: the tests that copy this process's build
needs_a_build = pytest.mark.skipif(native.load() is not None, reason="the package's C++ kernels are unavailable here")

#: in the child: record every write under the extension root and every process started
AUDIT = """
import os, sys
root = os.environ["TORCH_EXTENSIONS_DIR"]
events = []
def audit(event, args):
    if event == "subprocess.Popen" or (event in ("os.mkdir", "os.remove", "os.rename", "os.rmdir", "shutil.rmtree")
                                       and str(args[0]).startswith(root)):
        events.append((event, str(args[0])))
    elif event == "open" and str(args[0]).startswith(root) and (args[2] or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
        events.append((event, str(args[0])))
sys.addaudithook(audit)
"""


def _child(root: Path, code: str, env: dict[str, str] | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` (after ``from sac_spectral.core import native``) in a new process whose extension root is
    ``root``."""
    environment = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", "from sac_spectral.core import native\n" + code], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=timeout)


def _folder(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The build folder that processes with the extension root ``root`` use."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    return native.build_directory()


@pytest.fixture
def good_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of this process's good build, in the build folder of the extension root ``tmp_path``."""
    folder = native.build_directory()
    copy = _folder(tmp_path, monkeypatch)
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("lock"))
    return copy


@needs_a_build
def test_a_good_build_loads_with_no_lock_compiler_ninja_or_write(good_build, tmp_path):
    """A good build loads beside a lock left by a killed process (the torch loader's lock hung every
    start), in a read-only folder (refused before), and without running ninja or the compiler
    (another ninja on PATH rebuilt it from scratch): no process is started, nothing is written."""
    for lock in (good_build.with_suffix(".lock"), good_build / "lock"):
        lock.write_text("")
    for path in (good_build, good_build.parent):
        path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        proc = _child(tmp_path, AUDIT + "print(native.load())\nprint(events)", timeout=120)
    finally:
        for path in (good_build.parent, good_build):
            path.chmod(stat.S_IRWXU)
    assert proc.stdout.splitlines() == ["None", "[]"], proc.stdout + proc.stderr
    assert proc.stderr == ""


def test_a_lock_held_by_another_process_is_waited_for_at_most_the_timeout(tmp_path, monkeypatch):
    """With no build and a lock another process holds, a start waits for it, says so, and gives up
    after the timeout in one line that names the lock and what to delete; it builds nothing."""
    folder = _folder(tmp_path, monkeypatch)
    lock = folder.with_suffix(".lock")
    lock.parent.mkdir(parents=True)
    lock.write_text("")  # a process that has just created it, or torch's loader's empty lock
    proc = _child(tmp_path, "from sac_spectral.core import onednn, optim\n"
                            "print(native.load_from(native.build_directory(), timeout_s=1.0))", timeout=120)
    why = proc.stdout.strip()
    assert why.startswith(f"building onednn.cpp, adam.cpp in {folder} failed: the build lock {lock} is held by "
                          "another process (waited 1 s); if no process is building the kernels, delete "), why
    assert why.endswith(str(lock)) and "\n" not in why
    assert proc.stderr.startswith("waiting for another build of the C++ kernels") and not folder.exists()


def test_a_lock_left_by_a_process_that_is_gone_fails_at_once(tmp_path, monkeypatch):
    """A lock whose process (of this machine) is gone is not waited for: one line names it at once."""
    folder = _folder(tmp_path, monkeypatch)
    lock = folder.with_suffix(".lock")
    lock.parent.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(f"{gone.stdout.strip()} {socket.gethostname()}")
    proc = _child(tmp_path, "from sac_spectral.core import onednn, optim\n"
                            "print(native.load_from(native.build_directory(), timeout_s=600.0))", timeout=120)
    assert (f"held by process {gone.stdout.strip()}, which is gone; if no process is building the kernels, "
            f"delete {lock}" in proc.stdout), proc.stdout + proc.stderr
    assert proc.stderr == ""


@pytest.mark.slow
@needs_a_build
def test_a_corrupted_library_is_rebuilt(good_build, tmp_path):
    """A library that does not load (here overwritten) is built afresh, loaded and recorded."""
    library = good_build / "sac_spectral_native.so"
    library.write_bytes(b"not a library")
    proc = _child(tmp_path, "print(native.load())")
    assert proc.stdout.strip() == "None", proc.stdout + proc.stderr
    assert "building the C++ kernels in" in proc.stderr and "built the C++ kernels in" in proc.stderr
    assert hashlib.sha256(library.read_bytes()).hexdigest() == (good_build / "sha256").read_text()


@pytest.mark.parametrize("env", [{"CXX": "/nonexistent/c++"}, {"PATH": "/nonexistent"}], ids=["CXX", "PATH"])
def test_a_missing_compiler_is_said_in_one_line(tmp_path, monkeypatch, env):
    """No compiler (``$CXX``, else ``c++`` on PATH) is said as such, not as ninja's last line."""
    folder = _folder(tmp_path, monkeypatch)
    monkeypatch.delenv("CXX", raising=False)
    proc = _child(tmp_path, "print(native.load())", env=env)
    compiler = env.get("CXX", "c++")
    assert proc.stdout.strip() == (f"building onednn.cpp, adam.cpp in {folder} failed: no C++ compiler: "
                                   f"{compiler!r} is not found (set CXX to one)"), proc.stdout + proc.stderr
    assert proc.stderr == ""


def test_a_compiled_update_says_in_one_line_why_its_products_stay_on_bmm(monkeypatch, capsys):
    """Where the kernels are unavailable, one line says why (Python's warning added its source line)."""
    why = "building onednn.cpp, adam.cpp in /x failed: no C++ compiler: 'c++' is not found (set CXX to one)"
    monkeypatch.setattr(native, "load", lambda: why)
    assert compiled._cpu_products.__wrapped__() == {}
    assert capsys.readouterr().err == f"warning: compiled products stay on torch.bmm: {why}\n"
