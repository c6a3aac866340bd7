"""What every runner shares: the command line, the run directory, atomic checkpoints and JSON,
graceful SIGINT/SIGTERM handling, and turning bad input into a one-line error.

A run directory holds TensorBoard event files, the resolved ``config.yaml``,
``checkpoints/latest.pt`` and, when the run completes, ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar

import torch
import yaml
from tqdm import tqdm

from sac_spectral.config import ConfigError, help_text, merge_sources, parse_override, read_yaml, to_dict
from sac_spectral.logging import RunLogger
from sac_spectral.threads import allowed_cores, choose_threads

T = TypeVar("T")
CONFIG_FILE = "config.yaml"
CHECKPOINT = Path("checkpoints") / "latest.pt"
SUMMARY = "summary.json"


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
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. critic.lr=1e-4")
    return parser


def resolve_config(
    cls: type[T], args: argparse.Namespace, resumable: Iterable[str] = ()
) -> tuple[T, Path | None]:
    """The run's config and, when resuming, its directory.

    On ``--resume`` the saved ``config.yaml`` is authoritative; only keys in ``resumable`` (such
    as ``total_steps``) may be overridden.
    """
    if args.resume is None:
        return merge_sources(cls, read_yaml(args.config) if args.config else None, args.overrides), None
    if args.config:
        raise ConfigError("--resume takes the run's saved config.yaml; do not pass --config as well")
    run_dir = Path(args.resume)
    if not (run_dir / CONFIG_FILE).is_file() or not (run_dir / CHECKPOINT).is_file():
        raise ConfigError(f"cannot resume '{run_dir}': expected {run_dir / CONFIG_FILE} and {run_dir / CHECKPOINT}")
    allowed = set(resumable)
    for text in args.overrides:
        key = ".".join(parse_override(text)[0])
        if key not in allowed:
            raise ConfigError(f"'{key}' cannot change on --resume; resumable keys: {', '.join(sorted(allowed)) or 'none'}")
    return merge_sources(cls, read_yaml(run_dir / CONFIG_FILE), args.overrides), run_dir


def check_new_run_dir(path: Path) -> None:
    """Refuse to start a fresh run in a directory that already holds files."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(f"run_dir '{path}' already exists and is not empty; resume it with --resume {path} or choose another run_dir")


def open_run_dir(cfg: Any, default_name: str) -> Path:
    """Create a fresh run directory — ``cfg.run_dir``, or ``runs/<default_name>__<time>`` stored back
    into ``cfg`` — refusing a non-empty one, and write the resolved ``config.yaml`` into it."""
    if cfg.run_dir is None:
        cfg.run_dir = str(Path("runs") / f"{default_name}__{datetime.now():%Y%m%d-%H%M%S}")
    path = Path(cfg.run_dir)
    check_new_run_dir(path)
    path.mkdir(parents=True, exist_ok=True)
    write_config(cfg, path)
    return path


def reopen_run_dir(cfg: Any, path: Path) -> dict[str, Any]:
    """Load ``path``'s checkpoint, point ``cfg.run_dir`` at it and rewrite ``config.yaml`` (resumable
    keys may have changed); returns the checkpoint."""
    state = load_checkpoint(path / CHECKPOINT)
    cfg.run_dir = str(path)
    write_config(cfg, path)
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


def report_nonfinite(where: str, run_dir: Path | None) -> None:
    """A non-finite loss or parameter stops a run; the last good checkpoint stays."""
    kept = run_dir / CHECKPOINT if run_dir else None
    last = f"the last good checkpoint is kept at {kept}" if kept and kept.is_file() else "no checkpoint had been written yet"
    print(f"error: non-finite loss or parameters at {where}; stopping; {last}", file=sys.stderr)


def report_done(headline: str, run_dir: Path) -> None:
    """The end-of-run message: what was done, where it is, and the TensorBoard command."""
    print(f"{headline}\nrun directory: {run_dir}\nview it with:  tensorboard --logdir {run_dir}")


def _atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o644)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """``torch.save`` to a temporary file in the same directory, then an atomic rename."""
    _atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (tensors and plain containers only)."""
    return torch.load(path, map_location="cpu", weights_only=True)


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

    run_dir: Path | None
    logger: RunLogger | None

    def open_new(self) -> Path: ...

    def open_resume(self, path: Path) -> None: ...

    def position(self) -> str: ...

    def finite(self) -> bool: ...

    def checkpoint(self) -> None: ...

    def train(self, stop: GracefulStop) -> int: ...


def end_nonfinite(runner: Runner, bar: tqdm) -> int:
    """Stop a run whose loss or parameters went non-finite; the last good checkpoint stays. Exit code 1."""
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


def runner_main(
    module: str, description: str, cls: type[T], resumable: Iterable[str],
    build: Callable[[T], Runner], argv: Sequence[str] | None = None,
) -> int:
    """Parse ``argv``, resolve the config, open a fresh or resumed run and train it under
    :class:`GracefulStop`; returns the exit code (config errors propagate as ConfigError)."""
    args = build_parser(f"python -m {module}", description, cls).parse_args(argv)
    cfg, resume_dir = resolve_config(cls, args, resumable)
    with GracefulStop() as stop:
        runner = build(cfg)
        if resume_dir is None:
            runner.open_new()
        else:
            runner.open_resume(resume_dir)
            print(f"resuming {resume_dir} at {runner.position()}", file=sys.stderr)
        return runner.train(stop)


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run ``main`` turning configuration errors into ``error: …`` and exit code 2."""
    try:
        return main(argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
