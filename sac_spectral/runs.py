"""What every runner shares: the command line, the run directory, atomic checkpoints and JSON,
graceful SIGINT/SIGTERM handling, and turning bad input into a one-line error.

A run directory holds TensorBoard event files, the resolved ``config.yaml``,
``checkpoints/latest.pt`` and, when the run completes, ``summary.json``. A process that uses a
run directory holds an exclusive ``flock`` on it, so two processes never write the same run.

Exit codes: 0 done; 2 bad input (a one-line ``error: …``, nothing written or overwritten); 1 a
non-finite run, a full disk or another I/O failure (the last good checkpoint is kept);
128 + the signal after SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import pickle
import re
import signal
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any, Protocol, TypeVar

import torch
import yaml
from tqdm import tqdm

from sac_spectral.config import ConfigError, check, describe, help_text, merge_sources, parse_override, read_yaml, to_dict
from sac_spectral.logging import RunLogger, flatten
from sac_spectral.threads import allowed_cores, choose_threads

T = TypeVar("T")
CONFIG_FILE = "config.yaml"
CHECKPOINT = Path("checkpoints") / "latest.pt"
SUMMARY = "summary.json"
#: a ``key=value`` override on the command line (a key never starts with ``-`` or ``=``)
OVERRIDE = re.compile(r"^[^-=][^=]*=")
#: errno values that mean the disk (or a file-size or quota limit) is full
NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
#: errno values that mean a path cannot be written by this process
UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP}


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: unreadable, corrupted, unsafe, or made by another config."""


def one_line(err: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, without torch's advice to load unsafely."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def build_parser(prog: str, description: str, cls: type) -> argparse.ArgumentParser:
    """``--config FILE``, ``--resume RUN_DIR`` and ``key=value`` overrides; ``--help`` lists keys."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="configuration keys (override with key=value, nested keys dotted):\n" + help_text(cls),
    )
    parser.add_argument("--config", metavar="FILE", help="YAML config; keys not given keep their defaults")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    dotted = next((key for key, tp, _, _ in describe(cls) if "." in key and key.endswith(".lr") and tp == "float"), None)
    example = "seed=3" + (f" {dotted}=1e-4" if dotted else "")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=f"config overrides, e.g. {example}")
    return parser


def split_overrides(argv: Sequence[str], value_options: Iterable[str]) -> tuple[list[str], list[str]]:
    """Separate ``key=value`` overrides, wherever they stand, from the other arguments; the word
    after an option in ``value_options`` (one that takes a value) is that option's value."""
    takes_value = set(value_options)
    overrides, rest = [], []
    it = iter(argv)
    for arg in it:
        if arg in takes_value:
            rest.append(arg)
            value = next(it, None)
            if value is not None:
                rest.append(value)
        elif OVERRIDE.match(arg):
            overrides.append(arg)
        else:
            rest.append(arg)
    return overrides, rest


def parse_cli(parser: argparse.ArgumentParser, argv: Sequence[str] | None, value_options: Iterable[str]) -> argparse.Namespace:
    """``parser.parse_args`` with ``key=value`` overrides accepted anywhere on the command line
    (before, between and after options); they land in ``args.overrides`` in their order."""
    overrides, rest = split_overrides(list(sys.argv[1:] if argv is None else argv), value_options)
    args = parser.parse_args(rest)
    args.overrides = overrides + list(getattr(args, "overrides", None) or [])
    return args


@dataclass
class Resolved:
    """What the command line asks for: the config, and on ``--resume`` the run directory;
    ``restart`` when that run stopped before its first checkpoint and starts afresh."""

    cfg: Any
    resume_dir: Path | None = None
    restart: bool = False


def resolve_config(cls: type[T], args: argparse.Namespace, resumable: Iterable[str] = ()) -> Resolved:
    """The run's config and, when resuming, its directory.

    On ``--resume`` the saved ``config.yaml`` is authoritative; only keys in ``resumable`` (such
    as ``total_steps``) may be overridden, and ``config.yaml`` must agree with the config recorded
    in the checkpoint on every other key (a hand edit is refused, naming the key). A run directory
    whose run was stopped before its first checkpoint restarts from its ``config.yaml``.
    """
    if args.resume is None:
        return Resolved(merge_sources(cls, read_yaml(args.config) if args.config else None, args.overrides))
    if args.config:
        raise ConfigError("--resume takes the run's saved config.yaml; do not pass --config as well")
    run_dir = Path(args.resume)
    if not run_dir.is_dir():
        what = "is a file, not a run directory" if run_dir.exists() else "no such run directory"
        raise ConfigError(f"cannot resume '{run_dir}': {what}")
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"cannot resume '{run_dir}': {run_dir / CONFIG_FILE} is missing")
    allowed = set(resumable)
    for text in args.overrides:
        key = ".".join(parse_override(text)[0])
        if key not in allowed:
            raise ConfigError(f"'{key}' cannot change on --resume; resumable keys: {', '.join(sorted(allowed)) or 'none'}")
    data = read_yaml(run_dir / CONFIG_FILE)
    try:
        merge_sources(cls, data)
    except ConfigError as err:
        raise ConfigError(f"{run_dir / CONFIG_FILE}: {err}") from None
    cfg = merge_sources(cls, data, args.overrides)
    checkpoint = run_dir / CHECKPOINT
    if not checkpoint.exists() and is_unstarted_run_dir(run_dir, cls):
        return Resolved(cfg, run_dir, restart=True)
    if not checkpoint.is_file():
        raise ConfigError(f"cannot resume '{run_dir}': {checkpoint} is missing")
    saved = checkpoint_config(checkpoint)
    if saved is not None:
        diffs = config_differences(saved, cfg, allowed)
        if diffs:
            raise ConfigError(
                f"{run_dir / CONFIG_FILE} differs from the config its checkpoint was written with: {'; '.join(diffs)}. "
                f"Only {', '.join(sorted(allowed))} may change on --resume; restore the file or start a new run"
            )
    return Resolved(cfg, run_dir)


def config_differences(saved: Mapping[str, Any], cfg: Any, resumable: Iterable[str]) -> list[str]:
    """Keys (other than ``run_dir`` and ``resumable`` ones) whose value in ``cfg`` differs from the
    ``saved`` config dict, as ``key is X in config.yaml, Y in the checkpoint``."""
    skip = {"run_dir", *resumable}
    now, then = flatten(to_dict(cfg)), flatten(saved)
    return [
        f"{key} is {now[key]!r} in {CONFIG_FILE}, {then[key]!r} in the checkpoint"
        for key in then
        if key in now and key not in skip and now[key] != then[key]
    ]


def recorded_config(cfg: Any) -> dict[str, Any]:
    """The config a checkpoint records: every key but ``run_dir`` (a run may move)."""
    return {k: v for k, v in to_dict(cfg).items() if k != "run_dir"}


# ----------------------------------------------------------------------------- run directories
_STALE = re.compile(r"^\.(latest\.pt|config\.yaml|summary\.json)\..+\.tmp$")
_EVENTS = "events.out.tfevents."
_LOCKS: dict[Path, int] = {}


def stale_temp_files(run_dir: Path) -> list[Path]:
    """Temporary files of interrupted atomic writes (a kill -9 during a checkpoint write)."""
    return [p for d in (run_dir, run_dir / CHECKPOINT.parent) if d.is_dir() for p in d.iterdir() if _STALE.match(p.name)]


def remove_stale_temp_files(run_dir: Path) -> None:
    for p in stale_temp_files(run_dir):
        p.unlink(missing_ok=True)


def is_unstarted_run_dir(path: Path, cls: type) -> bool:
    """A run directory whose run was stopped (e.g. by kill -9) before its first checkpoint: a
    ``config.yaml`` as a run of config class ``cls`` writes it (every key; a hand-written file
    never counts), TensorBoard events and stale temporary files; no checkpoint, no summary."""
    if not path.is_dir() or not (path / CONFIG_FILE).is_file():
        return False
    try:
        written = flatten(read_yaml(path / CONFIG_FILE))
    except ConfigError:
        return False
    if set(written) != set(flatten(to_dict(cls()))):
        return False
    stale = set(stale_temp_files(path))
    for p in path.iterdir():
        if p.name == CHECKPOINT.parent.name and p.is_dir():
            if any(q not in stale for q in p.iterdir()):
                return False
        elif not (p.name == CONFIG_FILE or p.name.startswith(_EVENTS) or p in stale):
            return False
    return True


def check_new_run_dir(path: Path, cls: type) -> bool:
    """Refuse to start a fresh run in a file or in a directory that already holds files; True if
    ``path`` holds only a run (of config class ``cls``) stopped before its first checkpoint, which
    a fresh run may replace."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"run_dir '{path}' is a file, not a directory; choose another run_dir")
    if not path.exists() or not any(path.iterdir()):
        return False
    if is_unstarted_run_dir(path, cls):
        return True
    if (path / CHECKPOINT).exists() or (path / SUMMARY).exists():
        raise ConfigError(f"run_dir '{path}' already exists and holds a run; resume it with --resume {path} or choose another run_dir")
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
    missing = [p for p in (path, *path.parents) if not p.exists()][::-1]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if err.errno in NO_SPACE:
            raise
        raise ConfigError(f"run_dir '{path}' cannot be created: {err.strerror or err}") from None
    return missing


def open_run_dir(cfg: Any, default_name: str, root: str = "runs") -> Path:
    """Create a fresh run directory — ``cfg.run_dir``, or ``<root>/<default_name>__<time>`` stored
    back into ``cfg`` — refusing a non-empty one, lock it and write the resolved ``config.yaml`` into
    it. A directory that holds only a run stopped before its first checkpoint is reused (its events
    and temporary files are removed). If ``config.yaml`` cannot be written, what was created is removed."""
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
            for p in [*path.glob(f"{_EVENTS}*"), *stale_temp_files(path)]:
                p.unlink()
            print(f"note: {path} held a run stopped before its first checkpoint; starting afresh in it", file=sys.stderr)
        write_config(cfg, path)
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


def set_torch_threads(requested: int) -> str:
    """Give torch ``requested`` CPU threads, or with 0 the cores other processes left idle while this
    one started (:mod:`sac_spectral.threads`). Returns how many and why, for the run's summary line."""
    threads, why = choose_threads(requested, torch.get_num_threads())
    torch.set_num_threads(threads)
    plural = "s" * (threads > 1)
    if requested == 0 and threads < len(allowed_cores()):
        return f"{threads} thread{plural} (threads=0: {why}; set threads=N to choose)"
    return f"{threads} thread{plural}"


def progress_bar(total: int, initial: int, unit: str, enabled: bool) -> tqdm:
    """The runners' progress bar (disabled by ``progress=false``)."""
    return tqdm(total=total, initial=initial, unit=unit, disable=not enabled, dynamic_ncols=True)


def report_stopped(prog: str, run_dir: Path, where: str) -> None:
    """After a signal: the checkpoint is written; print how to resume."""
    print(f"stopped at {where}; checkpoint written. Resume with:\n  python -m {prog} --resume {run_dir}", file=sys.stderr)


def _kept(run_dir: Path | None) -> str:
    kept = run_dir / CHECKPOINT if run_dir else None
    return f"the last good checkpoint is kept at {kept}" if kept and kept.is_file() else "no checkpoint had been written yet"


def report_nonfinite(where: str, run_dir: Path | None) -> None:
    """A non-finite loss, parameter or optimizer state stops a run; the last good checkpoint stays."""
    print(f"error: non-finite loss, parameters or optimizer state at {where}; stopping; {_kept(run_dir)}", file=sys.stderr)


def report_done(headline: str, run_dir: Path) -> None:
    """The end-of-run message: what was done, where it is, and the TensorBoard command."""
    print(f"{headline}\nrun directory: {run_dir}\nview it with:  tensorboard --logdir {run_dir}")


def check_device(device: str) -> None:
    """The ``device`` key of every runner: ``cpu``, or ``cuda[:i]`` where CUDA is available."""
    check(
        device == "cpu" or (device.startswith("cuda") and torch.cuda.is_available()),
        "device",
        f"'{device}' is not available here; valid: cpu" + (", cuda" if torch.cuda.is_available() else ""),
    )


def finish_run(runner: Runner, summary: dict[str, Any], final_metrics: dict[str, float], headline: str) -> None:
    """The end of every completed run: ``summary.json``, the hyperparameters with ``final_metrics``
    in TensorBoard's HPARAMS tab, the closed logger and the end-of-run message."""
    assert runner.logger is not None and runner.run_dir is not None
    write_json(runner.run_dir / SUMMARY, summary)
    hp = {k: v for k, v in flatten(to_dict(runner.cfg)).items() if k != "run_dir"}
    runner.logger.hparams(hp, final_metrics)
    runner.logger.close()
    report_done(headline, runner.run_dir)


# ----------------------------------------------------------------------------- atomic files
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


def _atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write to a temporary file in ``path``'s directory, fsync, rename over ``path``. On failure
    the temporary file is removed, ``path`` is untouched, and an OSError names ``path``."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
        os.replace(tmp, path)
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
    _atomic_write(path, lambda f: torch.save(state, f))


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


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (tensors and plain containers only) after
    checking its checksums; a file that cannot be used raises a one-line :class:`CheckpointError`."""
    verify_archive(path)
    state = _torch_load(path, mmap=False)
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a run's state; nothing was changed")
    return state


def checkpoint_config(path: Path) -> dict[str, Any] | None:
    """The config recorded in a checkpoint (``None`` for checkpoints that predate the record),
    read without loading its tensors (memory-mapped)."""
    state = _torch_load(path, mmap=True)
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a run's state; nothing was changed")
    saved = state.get("config")
    return saved if isinstance(saved, dict) else None


def write_json(path: Path, data: Any) -> None:
    _atomic_write(path, lambda f: f.write(json.dumps(data, indent=2, default=float) + "\n"), mode="w")


def write_config(cfg: Any, run_dir: Path) -> None:
    _atomic_write(run_dir / CONFIG_FILE, lambda f: yaml.safe_dump(to_dict(cfg), f, sort_keys=False), mode="w")


class GracefulStop:
    """Context manager: the first SIGINT/SIGTERM sets ``requested``; a second SIGINT aborts."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signum
        print(f"\n{signal.Signals(signum).name} received: finishing this step and writing a checkpoint "
              "(press Ctrl-C again to abort without saving)", file=sys.stderr, flush=True)

    def __enter__(self) -> GracefulStop:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Runner(Protocol):
    """What :func:`runner_main` drives: a fresh or resumed run, trained until done or stopped."""

    cfg: Any
    run_dir: Path | None
    logger: RunLogger | None

    def open_new(self) -> Path: ...

    def open_resume(self, path: Path) -> None: ...

    def position(self) -> str: ...

    def describe(self) -> str: ...

    def finite(self) -> bool: ...

    def checkpoint(self) -> None: ...

    def train(self, stop: GracefulStop) -> int: ...


def end_nonfinite(runner: Runner, bar: tqdm) -> int:
    """Stop a run whose loss, parameters or optimizer state went non-finite; the last good
    checkpoint stays. Exit code 1."""
    bar.close()
    report_nonfinite(runner.position(), runner.run_dir)
    if runner.logger is not None:
        runner.logger.close()
    return 1


def end_stopped(runner: Runner, bar: tqdm, prog: str, signum: int) -> int:
    """After SIGINT/SIGTERM: write a checkpoint, say how to resume; exit code 128 + the signal."""
    if not runner.finite():
        return end_nonfinite(runner, bar)
    bar.close()
    runner.checkpoint()
    assert runner.logger is not None and runner.run_dir is not None
    runner.logger.close()
    report_stopped(prog, runner.run_dir, runner.position())
    return 128 + signum


def describe_os_error(err: OSError) -> str:
    """``disk full (No space left on device) writing FILE`` or ``I/O error (…) on FILE``."""
    what = "disk full" if err.errno in NO_SPACE else "I/O error"
    where = f" writing {err.filename}" if err.filename else ""
    return f"{what} ({err.strerror or err}){where}"


def end_io_error(runner: Runner, err: OSError, prog: str) -> int:
    """A write failed mid-run (e.g. a full disk): say which, that the last good checkpoint stays
    and how to resume. Exit code 1."""
    if runner.logger is not None:
        try:
            runner.logger.close()
        except OSError:
            pass
    print(f"error: {describe_os_error(err)} at {runner.position()}; stopping; {_kept(runner.run_dir)}; "
          f"free some space, then resume with: python -m {prog} --resume {runner.run_dir}", file=sys.stderr)
    return 1


def _open_resumed(runner: Runner, cfg: Any, path: Path) -> None:
    """Load ``path``'s checkpoint into ``runner``; a checkpoint that does not fit is a one-line
    error and nothing is written. Then record the (resumable) config and drop stale temp files."""
    try:
        runner.open_resume(path)
    except ConfigError:
        raise
    except (KeyError, ValueError, RuntimeError, TypeError, IndexError, AttributeError) as err:
        raise CheckpointError(f"checkpoint {path / CHECKPOINT} does not fit this run's config "
                              f"({type(err).__name__}: {one_line(err, 160)}); nothing was changed") from None
    write_config(cfg, path)
    remove_stale_temp_files(path)


def runner_main(
    module: str, description: str, cls: type[T], resumable: Iterable[str],
    build: Callable[[T], Runner], argv: Sequence[str] | None = None,
) -> int:
    """Parse ``argv``, resolve the config, open a fresh, restarted or resumed run and train it
    under :class:`GracefulStop`; returns the exit code (config errors propagate as ConfigError).
    The run directory and a one-line summary of the config are printed before anything runs.
    A failed write mid-run ends with :func:`end_io_error`."""
    args = parse_cli(build_parser(f"python -m {module}", description, cls), argv, ("--config", "--resume"))
    resolved = resolve_config(cls, args, resumable)
    cfg, runner = resolved.cfg, None
    try:
        with GracefulStop() as stop:
            runner = build(cfg)
            if resolved.resume_dir is None:
                print(f"run directory: {runner.open_new()}", file=sys.stderr)
            elif resolved.restart:
                print(f"note: {resolved.resume_dir} has no checkpoint (its run stopped before the first one); "
                      "starting it afresh from its config.yaml", file=sys.stderr)
                cfg.run_dir = str(resolved.resume_dir)
                runner.open_new()
            else:
                _open_resumed(runner, cfg, resolved.resume_dir)
                print(f"resuming {resolved.resume_dir} at {runner.position()}", file=sys.stderr)
            print(f"config: {runner.describe()}", file=sys.stderr, flush=True)
            code = runner.train(stop)
            assert runner.run_dir is not None
            remove_stale_temp_files(runner.run_dir)
            return code
    except OSError as err:
        if runner is None or runner.run_dir is None:
            raise
        return end_io_error(runner, err, module)
    finally:
        release_run_dirs()


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run ``main`` turning errors into one ``error: …`` line: configuration errors exit with 2;
    a write that fails, memory that runs out exit with 1; an abort by a second Ctrl-C with 130."""
    try:
        return main(argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted before a checkpoint could be written (a second Ctrl-C aborts at once); "
              "the last checkpoint written, if any, is kept", file=sys.stderr)
        return 128 + signal.SIGINT
    except OSError as err:
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        return 1
    except (MemoryError, torch.OutOfMemoryError) as err:
        print(f"error: out of memory ({one_line(err, 160)}); reduce the batch, buffer or network sizes", file=sys.stderr)
        return 1
