"""Checkpoints and other run files, written atomically (a temporary file renamed over the old one,
fsynced) and read back safely (``weights_only``, the zip archive verified first). The one module
that both writes and reads the checkpoint file.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import stat
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from sac_spectral.core.config import (
    ConfigError,
    one_line,
)

#: errno values that mean the disk (or a file-size or quota limit) is full
NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: unreadable, corrupted, unsafe, or made by another config."""


class _RecordingWriter:
    """A binary file that remembers the OSError of a failed write: ``torch.save`` turns it into an
    uninformative ``RuntimeError`` (``unexpected pos …``)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.error = f, None

    def write(self, data: bytes) -> int:
        try:
            return self.f.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.f.flush()


def replaceable(path: Path) -> Path:
    """Where an atomic write of ``path`` renames its file: ``path`` with symbolic links followed,
    which must be a regular file or nothing. A directory, device, pipe or socket raises a
    one-line :class:`ConfigError` (a rename would replace it); a path that cannot be looked up
    raises its OSError."""
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a device, pipe or socket)"
        raise ConfigError(f"{path} is {kind}; only a regular file (or a new name) can be written, so nothing was "
                          "written")
    return target


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write to a temporary file in the directory of ``path`` (symbolic links followed), fsync,
    rename over it. Only a regular file or a new name is replaced (else :class:`ConfigError`, see
    :func:`replaceable`). On failure the temporary file is removed, ``path`` is untouched, and an
    OSError names ``path``."""
    tmp: str | None = None
    try:
        target = replaceable(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, mode) as f:
            sink = _RecordingWriter(f) if "b" in mode else f
            try:
                write(sink)
            except RuntimeError:
                if isinstance(sink, _RecordingWriter) and sink.error is not None:
                    raise sink.error from None
                raise
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` to a temporary file in the same directory, then an atomic rename."""
    atomic_write(path, lambda f: torch.save(state, f))


_UNSAFE = re.compile(r"(Unsupported global: GLOBAL [\w.]+|unsupported GLOBAL [\w.]+|Unsupported operand \d+)")


def _torch_load(path: Path, mmap: bool) -> Any:
    """``torch.load(weights_only=True)`` with every failure as one line that names ``path``."""
    unchanged = "nothing was changed"
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory, not a file; {unchanged}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        found = _UNSAFE.search(str(err))
        detail = f" ({found.group(1)})" if found else ""
        raise CheckpointError(f"checkpoint {path} holds objects other than tensors and plain containers{detail}; "
                              f"refused, since loading it could run code; {unchanged}") from None
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM, errno.ENOENT):
            raise CheckpointError(f"checkpoint {path} cannot be read: {err.strerror or err}; {unchanged}") from None
        raise CheckpointError(f"checkpoint {path} is not a readable PyTorch checkpoint, truncated or corrupted "
                              f"({err.strerror or err}); {unchanged}") from None
    except Exception as err:  # noqa: BLE001 - an untrusted file may fail in any way; say which file
        raise CheckpointError(f"checkpoint {path} is not a readable PyTorch checkpoint, truncated or corrupted "
                              f"({type(err).__name__}: {one_line(err, 120)}); {unchanged}") from None


def verify_archive(path: Path) -> None:
    """Check that ``path`` is a complete zip archive whose every record matches its CRC-32
    (``torch.load`` does not check them, so flipped bits would load silently)."""
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory, not a file; nothing was changed")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except OSError as err:
        raise CheckpointError(f"checkpoint {path} cannot be read: {err.strerror or err}; nothing was changed") from None
    except Exception as err:  # noqa: BLE001 - zipfile raises many kinds of errors on damaged archives
        raise CheckpointError(f"checkpoint {path} is not a readable PyTorch checkpoint, truncated or corrupted "
                              f"({type(err).__name__}: {one_line(err, 120)}); nothing was changed") from None
    if bad is not None:
        raise CheckpointError(f"checkpoint {path} is corrupted: record '{bad}' fails its checksum; nothing was changed")


def load_checkpoint(path: Path, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (tensors and plain containers only) after
    checking its checksums; a file that cannot be used raises a one-line :class:`CheckpointError`.
    ``mmap=True`` maps the tensors from the file instead of reading them: a reader that needs a few
    of them (the actor, not the replay buffer) touches only those pages."""
    verify_archive(path)
    state = _torch_load(path, mmap=mmap)
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a run's state; nothing was "
                              "changed")
    return state


def checkpoint_config(path: Path) -> dict[str, Any] | None:
    """The config recorded in a checkpoint (``None`` for checkpoints that predate the record),
    read without loading its tensors (memory-mapped)."""
    state = _torch_load(path, mmap=True)
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a run's state; nothing was "
                              "changed")
    saved = state.get("config")
    return saved if isinstance(saved, dict) else None


def write_json(path: Path, data: Any) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(data, indent=2, default=float) + "\n"), mode="w")
