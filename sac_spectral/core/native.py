"""The package's C++ CPU kernels, built once per machine and loaded: ``onednn.cpp`` (the member-batched
products of :mod:`sac_spectral.core.onednn`) and ``adam.cpp`` (the Adam step of
:mod:`sac_spectral.core.optim`). Their operators' schemas are defined in those modules; the library
registers their CPU implementations. Compiled CPU updates call both from inductor's C++ wrapper.

A build lives in a folder of its own (:func:`build_directory`: one per sources, torch and Python)
with the SHA-256 of its library. A process loads a build whose library has that hash with
``torch.ops.load_library`` alone: no lock, no compiler, no ninja, no write (a read-only folder
serves, and another ninja on ``PATH`` changes nothing). Anything else — no build, a library that
is corrupted or does not load, a build cut off — is built afresh by torch's C++ extension builder
under a lock file next to the folder, which a process waits for at most :data:`LOCK_TIMEOUT_S`."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

SOURCES = tuple(Path(__file__).with_name(name) for name in ("onednn.cpp", "adam.cpp"))
NAME = "sac_spectral_native"
CFLAGS = ("-O2",)
#: how long a process waits for another's build (one takes 1–2 min; several on a busy machine)
LOCK_TIMEOUT_S = 600.0


class NativeError(Exception):
    """Why the kernels cannot be built or loaded here, in one line."""


def build_directory() -> Path:
    """The folder of this machine's build of :data:`SOURCES` for this torch and Python: under
    torch's extension root (``$TORCH_EXTENSIONS_DIR``, else ``~/.cache/torch_extensions``),
    ``sac_spectral_native/<hash of the sources, flags, torch and Python versions>``."""
    from torch.utils import cpp_extension

    key = hashlib.sha256(repr((torch.__version__, torch.version.git_version, sys.version_info[:2], CFLAGS)).encode())
    for source in SOURCES:
        key.update(source.name.encode() + source.read_bytes())
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / NAME / key.hexdigest()[:16]


def _library(directory: Path) -> Path:
    return directory / f"{NAME}.so"


def _good(directory: Path) -> bool:
    """Whether ``directory`` holds a finished build: its library with the hash written after it was built."""
    try:
        return hashlib.sha256(_library(directory).read_bytes()).hexdigest() == (directory / "sha256").read_text()
    except OSError:
        return False


def _loads(directory: Path) -> bool:
    """Load ``directory``'s library if it is a finished build; whether it loaded."""
    if not _good(directory):
        return False
    try:
        torch.ops.load_library(str(_library(directory)))
    except OSError:
        return False
    return True


def _holder(lock: Path) -> tuple[str, bool]:
    """Who holds ``lock`` (its file says ``pid host``) and whether that process, of this machine, is gone."""
    try:
        pid, host = lock.read_text().split()
    except (OSError, ValueError):  # being written, or not ours
        return "another process", False
    if host != socket.gethostname():
        return f"process {pid} on {host}", False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return f"process {pid}, which is gone", True
    except (OSError, ValueError):  # alive (another user's), or not a pid
        pass
    return f"process {pid}", False


@contextlib.contextmanager
def _locked(lock: Path, timeout_s: float) -> Iterator[None]:
    """Hold ``lock`` (a file created exclusively, holding ``pid host``; removed on release), waiting
    at most ``timeout_s`` for another process's build, and not at all for a lock left by a process
    of this machine that is gone."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    deadline, waiting = time.monotonic() + timeout_s, False
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            holder, gone = _holder(lock)
        if gone or time.monotonic() > deadline:
            waited = "" if gone else f" (waited {timeout_s:g} s)"
            raise NativeError(f"the build lock {lock} is held by {holder}{waited}; if no process is building "
                              f"the kernels, delete {lock}")
        if not waiting:
            print(f"waiting for another build of the C++ kernels ({holder}; lock {lock})", file=sys.stderr, flush=True)
            waiting = True
        time.sleep(0.2)
    try:
        os.write(fd, f"{os.getpid()} {socket.gethostname()}".encode())
        os.close(fd)
        yield
    finally:
        lock.unlink(missing_ok=True)


def _build(directory: Path) -> None:
    """Build the library afresh in ``directory`` (its lock held) and load it; then write its hash."""
    from torch.utils import cpp_extension

    compiler = cpp_extension.get_cxx_compiler()
    if not compiler or shutil.which(compiler) is None:
        raise NativeError(f"no C++ compiler: {compiler!r} is not found (set CXX to one)")
    if not cpp_extension.is_ninja_available():
        raise NativeError("ninja is not found (pip install ninja)")
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    print(f"building the C++ kernels in {directory} (once per machine and version: 1–2 min, several on a busy "
          "machine)", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        cpp_extension.load(NAME, [str(s) for s in SOURCES], extra_cflags=list(CFLAGS), build_directory=str(directory),
                           is_python_module=False)
    except Exception as error:  # the build's own failure (its output), or torch's builder without an entry point
        lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
        raise NativeError(next((line for line in lines if "error" in line), lines[-1])) from error
    (directory / "sha256.tmp").write_text(hashlib.sha256(_library(directory).read_bytes()).hexdigest())
    os.replace(directory / "sha256.tmp", directory / "sha256")
    print(f"built the C++ kernels in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)


def load_from(directory: Path, timeout_s: float = LOCK_TIMEOUT_S) -> str | None:
    """Load the build in ``directory`` if it is good, else build it there first (under the lock
    ``<directory>.lock``, waiting at most ``timeout_s`` for another process's build): ``None``, or
    why the kernels are unavailable, in one line."""
    if _loads(directory):
        return None
    try:
        with _locked(directory.with_suffix(".lock"), timeout_s):
            if not _loads(directory):
                _build(directory)
    except (NativeError, OSError) as error:
        return f"building {', '.join(s.name for s in SOURCES)} in {directory} failed: {error}"
    return None


@functools.cache
def load(build: bool = True) -> str | None:
    """Load the kernels of this machine's build (:func:`build_directory`), building them the first
    time (1–2 min; torch's C++ extension builder, with the C++ compiler a compiled update needs
    anyway), or with ``build=False`` only if a good build is there: ``None``, or why they are
    unavailable here, in one line."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    from sac_spectral.core import onednn, optim  # noqa: F401  (the schemas the kernels implement)

    if not build:
        return None if _loads(build_directory()) else f"no finished build in {build_directory()}"
    return load_from(build_directory())
