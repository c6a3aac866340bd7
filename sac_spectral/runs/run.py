"""A run's life, shared by every runner: open a fresh, restarted or resumed run, train it under
:class:`GracefulStop`, and end it (done, stopped by a signal, non-finite, I/O error) with its
message and exit code.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from tqdm import tqdm

from sac_spectral.core.config import (
    ConfigError,
    one_line,
    to_dict,
)
from sac_spectral.runs.checkpoint import CheckpointError, write_json
from sac_spectral.runs.cli import (
    T,
    build_parser,
    describe_os_error,
    parse_cli,
    resolve_config,
)
from sac_spectral.runs.layout import CHECKPOINT, SUMMARY
from sac_spectral.runs.logger import RunLogger
from sac_spectral.core.config import flatten
from sac_spectral.runs.rundir import (
    release_run_dirs,
    remove_stale_temp_files,
    write_config,
)


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


def finish_run(runner: Runner, summary: dict[str, Any], final_metrics: dict[str, float], headline: str) -> None:
    """The end of every completed run: ``summary.json``, the hyperparameters with ``final_metrics``
    in TensorBoard's HPARAMS tab, the closed logger and the end-of-run message."""
    assert runner.logger is not None and runner.run_dir is not None
    write_json(runner.run_dir / SUMMARY, summary)
    hp = {k: v for k, v in flatten(to_dict(runner.cfg)).items() if k != "run_dir"}
    runner.logger.hparams(hp, final_metrics)
    runner.logger.close()
    report_done(headline, runner.run_dir)


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
