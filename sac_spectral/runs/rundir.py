"""Run directories: create a fresh one (refusing one that holds files), reopen one to resume,
lock it for this process (``flock``: two processes never write the same run), and the temporary
files of interrupted atomic writes.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from sac_spectral.core.config import (
    ConfigError,
    flatten,
    read_yaml,
    to_dict,
)
from sac_spectral.runs.checkpoint import NO_SPACE, atomic_write, load_checkpoint
from sac_spectral.runs.kinds import config_header
from sac_spectral.runs.layout import (
    CHECKPOINT,
    CONFIG_FILE,
    EVALS,
    EVENTS,
    SUMMARY,
    TEMP_FILE,
    VIDEO_FILE,
    VIDEOS,
    written_by_a_run,
)

#: errno values that mean a path cannot be used by this process (bad input, not an I/O failure)
UNUSABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP}


_LOCKS: dict[Path, int] = {}


def stale_temp_files(run_dir: Path) -> list[Path]:
    """Temporary files of interrupted atomic writes (a kill -9 during a write of the checkpoint,
    ``config.yaml``, ``summary.json`` or ``evals.csv``)."""
    return [p for d in (run_dir,
                        run_dir / CHECKPOINT.parent) if d.is_dir() for p in d.iterdir() if TEMP_FILE.match(p.name)]


def remove_stale_temp_files(run_dir: Path) -> None:
    for p in stale_temp_files(run_dir):
        p.unlink(missing_ok=True)


def is_unstarted_run_dir(path: Path, cls: type) -> bool:
    """A run directory whose run was stopped (e.g. by kill -9) before its first checkpoint: a
    ``config.yaml`` as a run of config class ``cls`` writes it (every key; a hand-written file
    never counts) and nothing else but what such a run writes (:func:`written_by_a_run`: events,
    evaluations, videos, temporary files); no checkpoint, no summary."""
    if not path.is_dir() or not (path / CONFIG_FILE).is_file():
        return False
    try:
        written = flatten(read_yaml(path / CONFIG_FILE))
    except ConfigError:
        return False
    return set(written) == set(flatten(to_dict(cls()))) and written_by_a_run(path)


def clear_unstarted_run_dir(path: Path) -> None:
    """Remove what a run stopped before its first checkpoint left in ``path`` but its
    ``config.yaml`` (rewritten by the restart): its events, evaluations (their rows would mix with
    the restart's), videos and temporary files."""
    videos = path / VIDEOS
    for p in [*path.glob(f"{EVENTS}*"), path / EVALS, *stale_temp_files(path),
              *(q for q in (videos.iterdir() if videos.is_dir() else ()) if VIDEO_FILE.match(q.name))]:
        p.unlink(missing_ok=True)
    if videos.is_dir():
        videos.rmdir()


def unusable(what: str, path: Path, err: OSError, use: str = "used") -> ConfigError:
    """``{what} '{path}' cannot be {use}: {reason}``, the one-line error for a path this process
    cannot use (an errno in :data:`UNUSABLE`)."""
    return ConfigError(f"{what} '{path}' cannot be {use}: {err.strerror or err}")


def lookup(path: Path, what: str, use: str = "used") -> os.stat_result | None:
    """The status of ``path``, None if nothing is there. A path that cannot be used (a name too
    long, a loop of links, a file in the way, no permission) is a :class:`ConfigError` (see
    :func:`unusable`); other failures stay OSErrors."""
    try:
        return path.stat()
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in UNUSABLE:
            raise unusable(what, path, err, use) from None
        raise


def check_new_run_dir(path: Path, cls: type) -> bool:
    """Refuse to start a fresh run in a file, in an unusable path or in a directory that already
    holds files; True if ``path`` holds only a run (of config class ``cls``) stopped before its
    first checkpoint, which a fresh run may replace."""
    found = lookup(path, "run_dir", "created")
    if found is not None and not stat.S_ISDIR(found.st_mode):
        raise ConfigError(f"run_dir '{path}' is a file, not a directory; choose another run_dir")
    try:
        if found is None or not any(path.iterdir()):
            return False
    except OSError as err:
        if err.errno in UNUSABLE:
            raise unusable("run_dir", path, err) from None
        raise
    if is_unstarted_run_dir(path, cls):
        return True
    if (path / CHECKPOINT).exists() or (path / SUMMARY).exists():
        raise ConfigError(f"run_dir '{path}' already exists and holds a run; resume it with --resume {path} or choose "
                          "another run_dir")
    raise ConfigError(f"run_dir '{path}' already exists and holds other files; choose another (or an empty) run_dir")


def lock_run_dir(path: Path) -> None:
    """Hold an exclusive lock on ``path`` until :func:`release_run_dirs` (or the process ends,
    also by kill -9); refuse a directory another process holds."""
    key = path.resolve()
    if key in _LOCKS:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"run_dir '{path}' is in use by another process (a run or a resume of it); "
                          "wait for it to end or stop it first") from None
    _LOCKS[key] = fd


def release_run_dirs() -> None:
    """Release every run-directory lock this process holds."""
    for fd in _LOCKS.values():
        os.close(fd)
    _LOCKS.clear()


def _make_dirs(path: Path) -> list[Path]:
    """``mkdir -p path``; returns the directories it created, outermost first. An unwritable
    location is bad input (ConfigError); a full disk stays an OSError."""
    try:
        missing = [p for p in (path, *path.parents) if lookup(p, "run_dir", "created") is None][::-1]
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if err.errno in NO_SPACE:
            raise
        raise ConfigError(f"run_dir '{path}' cannot be created: {err.strerror or err}") from None
    return missing


def open_run_dir(cfg: Any, kind: str, default_name: str, root: str = "runs") -> Path:
    """Create a fresh run directory — ``cfg.run_dir``, or ``<root>/<default_name>__<time>`` stored
    back into ``cfg`` — refusing a non-empty one, lock it and write the resolved ``config.yaml`` of a
    run of ``kind`` into it. A directory that holds only a run stopped before its first checkpoint is reused (what that
    run wrote is removed, :func:`clear_unstarted_run_dir`). If ``config.yaml`` cannot be written,
    what was created is removed."""
    if cfg.run_dir is None:
        cfg.run_dir = str(Path(root) / f"{default_name}__{datetime.now():%Y%m%d-%H%M%S}")
    if not str(cfg.run_dir).strip():
        raise ConfigError(f"run_dir: empty; give a directory, or leave run_dir out for {root}/<name>__<time>")
    path = Path(cfg.run_dir)
    reuse = check_new_run_dir(path, type(cfg))
    created = _make_dirs(path)
    try:
        lock_run_dir(path)
        if check_new_run_dir(path, type(cfg)):  # under the lock: nobody else is using it
            if not reuse:
                raise ConfigError(f"run_dir '{path}' was filled by another process; choose another run_dir")
            clear_unstarted_run_dir(path)
            print(f"note: {path} held a run stopped before its first checkpoint; starting afresh in it",
                  file=sys.stderr)
        write_config(cfg, kind, path)
    except BaseException as err:
        if created:
            release_run_dirs()
            for p in reversed(created):
                try:
                    p.rmdir()
                except OSError:
                    break
        if isinstance(err, OSError) and err.errno not in NO_SPACE:
            raise ConfigError(f"run_dir '{path}' is not writable: {err.strerror or err}") from None
        raise
    return path


def reopen_run_dir(cfg: Any, path: Path) -> dict[str, Any]:
    """Lock ``path``, load its checkpoint and point ``cfg.run_dir`` at it; returns the checkpoint.
    Nothing is written: :func:`runner_main` rewrites ``config.yaml`` once the runner accepted it."""
    lock_run_dir(path)
    state = load_checkpoint(path / CHECKPOINT)
    cfg.run_dir = str(path)
    return state


def write_config(cfg: Any, kind: str, run_dir: Path) -> None:
    """``config.yaml``: the run's kind in a comment line (:func:`~sac_spectral.runs.kinds.config_header`),
    then the resolved config."""

    def write(f: Any) -> None:
        f.write(config_header(kind))
        yaml.safe_dump(to_dict(cfg), f, sort_keys=False)

    atomic_write(run_dir / CONFIG_FILE, write, mode="w")
