"""A run's life, shared by every runner: :class:`Run` opens a fresh, restarted or resumed run,
drives the runner's loop under :class:`GracefulStop`, carries out its declared schedule of
periodic work and checkpoints, and ends it — done, stopped by a signal, non-finite, failed, or an
I/O failure — with its message and exit code.

A runner is a :class:`Loop`: it knows how to build, save and describe itself and trains by
calling :meth:`Run.after` once per step (env step or iteration). The ends are exceptions carrying
their exit code (:class:`RunEnd`), caught once, in :meth:`Run.execute`.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from tqdm import tqdm

from sac_spectral.core.config import ConfigError, flatten, one_line, to_dict
from sac_spectral.core.heap import configure_heap
from sac_spectral.runs.checkpoint import CheckpointError, save_checkpoint, write_json
from sac_spectral.runs.cli import T, build_parser, describe_os_error, parse_cli, resolve_config
from sac_spectral.runs.layout import CHECKPOINT, SUMMARY
from sac_spectral.runs.logger import RunLogger
from sac_spectral.runs.rundir import release_run_dirs, remove_stale_temp_files, write_config

#: the progress bar without tqdm's time-left estimate: its rate over the steps done so far says
#: nothing of the work left (a warm-up step costs far less than a step with updates)
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"
#: progress lines a run prints when stderr is not a terminal (a log file, a cluster job)
PLAIN_LINES = 20


class RunEnd(Exception):
    """A run that ends before it is done; ``code`` is the process's exit code."""

    code = 1


class NonFinite(RunEnd):
    """A non-finite loss, parameter or optimizer state: stop, keep the last good checkpoint (exit 1)."""


class Failed(RunEnd):
    """What the run trains on failed (a simulator whose state blew up): checkpoint what the run has,
    then one line that says why (exit 1)."""


class Finished(Exception):
    """Raised by a loop's ``open_resume`` for a run that is already done: :meth:`Run.main` prints
    its one-line message and exits with 0, nothing written."""


class Stopped(RunEnd):
    """SIGINT/SIGTERM: checkpoint and say how to resume (exit 128 + the signal)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


def every(n: int, end: int | None = None) -> Callable[[int], bool]:
    """A schedule's predicate: due at the multiples of ``n`` (``0`` = never) and at ``end``."""
    return lambda position: (n > 0 and position % n == 0) or position == end


@dataclass
class Schedule:
    """The periodic work after each step, declared once by the runner: ``jobs`` in their order
    (``(name, due, action)``: ``action()`` when ``due(position)``), then — unless a stop was
    requested, which checkpoints and ends the run — a checkpoint when ``checkpoint(position)``."""

    jobs: list[tuple[str, Callable[[int], bool], Callable[[], object]]] = field(default_factory=list)
    checkpoint: Callable[[int], bool] = field(default=lambda position: False)


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


class Loop(Protocol):
    """What a :class:`Run` drives: a fresh or resumed run, trained until done or stopped. ``kind``
    (a registered :class:`~sac_spectral.runs.kinds.RunKind`'s name) is recorded in ``config.yaml``,
    the checkpoint and the summary."""

    kind: str
    cfg: Any
    run_dir: Path | None
    logger: RunLogger | None
    wall_time: float

    def open_new(self) -> Path: ...

    def open_resume(self, path: Path) -> None:
        """Load the run in ``path`` (it may raise :class:`Finished`)."""

    def position(self) -> str: ...

    def describe(self) -> str: ...

    def finite(self) -> bool: ...

    def state_dict(self) -> dict[str, Any]: ...

    def train(self, run: Run) -> None: ...

    def summary(self) -> dict[str, Any]: ...

    def headline(self, summary: dict[str, Any]) -> tuple[str, dict[str, float]]: ...


class Run:
    """One run's life around its :class:`Loop`: the progress bar, stops, the schedule, checkpoints,
    the summary and the ends. ``module`` is the runner's ``python -m`` name (for messages)."""

    def __init__(self, module: str, loop: Loop, stop: GracefulStop) -> None:
        configure_heap()  # a training process: freed memory stays in the heap for the next update
        self.module, self.loop, self.stop = module, loop, stop
        self.schedule = Schedule()
        self.bar: tqdm | None = None
        self.total, self.unit, self.plain_every = 0, "step", 0
        self._start = time.perf_counter()

    def begin(self, schedule: Schedule, total: int, initial: int, unit: str) -> tqdm:
        """Start the clock (continuing the loop's ``wall_time``) and the progress bar (off with
        ``progress=false``) and take the loop's schedule."""
        self.schedule, self.total, self.unit = schedule, total, unit
        self._start = time.perf_counter() - self.loop.wall_time
        show = bool(self.loop.cfg.progress)
        self.plain_every = max(1, total // PLAIN_LINES) if show and not sys.stderr.isatty() else 0
        self.bar = tqdm(total=total, initial=initial, unit=unit, disable=not show or bool(self.plain_every),
                        dynamic_ncols=True, bar_format=BAR_FORMAT)
        return self.bar

    def tick(self) -> None:
        """Bring the loop's ``wall_time`` up to now."""
        self.loop.wall_time = time.perf_counter() - self._start

    def check_stop(self) -> None:
        """End the run (with a checkpoint) if a stop was requested."""
        if self.stop.requested is not None:
            raise Stopped(self.stop.requested)

    def after(self, position: int) -> None:
        """The periodic work after step ``position``: the due jobs in order, the bar, the clock,
        then a requested stop or a due checkpoint."""
        for _, due, action in self.schedule.jobs:
            if due(position):
                action()
        if self.bar is not None:
            self.bar.update(1)
        self.tick()
        if self.plain_every and (position % self.plain_every == 0 or position == self.total):
            metrics = " ".join(f"{k}={v}" for k, v in getattr(self.loop, "postfix", {}).items())
            print(f"{self.unit} {position}/{self.total} ({100 * position / self.total:.0f}%) "
                  f"{self.loop.wall_time:.0f} s {metrics}".rstrip(), file=sys.stderr, flush=True)
        self.check_stop()
        if self.schedule.checkpoint(position):
            self.checkpoint()

    def checkpoint(self) -> None:
        """Write the loop's state atomically; a non-finite state ends the run instead."""
        if not self.loop.finite():
            raise NonFinite
        assert self.loop.run_dir is not None
        save_checkpoint({**self.loop.state_dict(), "kind": self.loop.kind}, self.loop.run_dir / CHECKPOINT)

    # ----------------------------------------------------------------------------- the ends
    def execute(self) -> int:
        """Train the loop to its end; returns the exit code."""
        loop = self.loop
        try:
            if self.stop.requested is not None:  # stopped during start-up: nothing to save
                print(f"stopped by {signal.Signals(self.stop.requested).name} before training started", file=sys.stderr)
                return 128 + self.stop.requested
            loop.train(self)
            self._close_bar()
            self._finish()
            return 0
        except Stopped as end:
            self._close_bar()
            if not loop.finite():
                return self._nonfinite()
            self.checkpoint()
            self._close_logger()
            print(f"stopped at {loop.position()}; checkpoint written. Resume with:\n"
                  f"  python -m {self.module} --resume {loop.run_dir}", file=sys.stderr)
            return end.code
        except NonFinite:
            self._close_bar()
            return self._nonfinite()
        except Failed as end:
            self._close_bar()
            if not loop.finite():
                return self._nonfinite()
            self.checkpoint()
            self._close_logger()
            print(f"error: {end} at {loop.position()}; stopping; checkpoint written to {loop.run_dir / CHECKPOINT}",
                  file=sys.stderr)
            return end.code
        except OSError as err:
            self._close_bar()
            self._close_logger()
            print(f"error: {describe_os_error(err)} at {loop.position()}; stopping; {self._kept()}; "
                  f"free some space, then resume with: python -m {self.module} --resume {loop.run_dir}",
                  file=sys.stderr)
            return 1

    def _finish(self) -> None:
        """``summary.json``, the hyperparameters with the final metrics in TensorBoard's HPARAMS tab,
        the closed logger and the end-of-run message."""
        loop = self.loop
        assert loop.logger is not None and loop.run_dir is not None
        summary = loop.summary()
        headline, final_metrics = loop.headline(summary)
        write_json(loop.run_dir / SUMMARY, {"kind": loop.kind, **summary})
        hp = {k: v for k, v in flatten(to_dict(loop.cfg)).items() if k != "run_dir"}
        loop.logger.hparams(hp, final_metrics)
        loop.logger.close()
        print(f"{headline}\nrun directory: {loop.run_dir}\n"
              f"view it with:  tensorboard --logdir {loop.run_dir.parent}  (this run: {loop.run_dir.name})")

    def _nonfinite(self) -> int:
        print(f"error: non-finite loss, parameters or optimizer state at {self.loop.position()}; stopping; "
              f"{self._kept()}", file=sys.stderr)
        self._close_logger()
        return NonFinite.code

    def _kept(self) -> str:
        run_dir = self.loop.run_dir
        kept = run_dir / CHECKPOINT if run_dir else None
        return (f"the last good checkpoint is kept at {kept}" if kept and kept.is_file()
                else "no checkpoint had been written yet")

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _close_logger(self) -> None:
        if self.loop.logger is not None:
            try:
                self.loop.logger.close()
            except OSError:
                pass

    # ----------------------------------------------------------------------------- the command
    @classmethod
    def main(cls, module: str, description: str, config: type[T], resumable: Iterable[str],
             build: Callable[[T], Loop], argv: Sequence[str] | None = None) -> int:
        """Parse ``argv``, resolve the config, open a fresh, restarted or resumed run and execute it
        under :class:`GracefulStop`; returns the exit code (config errors propagate as ConfigError).
        The run directory and a one-line summary of the config are printed before anything runs;
        a resumed run that is already finished prints one line and changes nothing."""
        args = parse_cli(build_parser(f"python -m {module}", description, config), argv, ("--config", "--resume"))
        resolved = resolve_config(config, args, resumable)
        cfg = resolved.cfg
        try:
            with GracefulStop() as stop:
                loop = build(cfg)
                if resolved.resume_dir is None:
                    print(f"run directory: {loop.open_new()}", file=sys.stderr)
                elif resolved.restart:
                    print(f"note: {resolved.resume_dir} has no checkpoint (its run stopped before the first one); "
                          "starting it afresh from its config.yaml", file=sys.stderr)
                    cfg.run_dir = str(resolved.resume_dir)
                    loop.open_new()
                else:
                    try:
                        _open_resumed(loop, cfg, resolved.resume_dir)
                    except Finished as done:
                        print(done)
                        return 0
                    print(f"resuming {resolved.resume_dir} at {loop.position()}", file=sys.stderr)
                print(f"config: {loop.describe()}", file=sys.stderr, flush=True)
                code = cls(module, loop, stop).execute()
                assert loop.run_dir is not None
                remove_stale_temp_files(loop.run_dir)
                return code
        finally:
            release_run_dirs()


def _open_resumed(loop: Loop, cfg: Any, path: Path) -> None:
    """Load ``path``'s checkpoint into ``loop``; a checkpoint that does not fit is a one-line
    error and nothing is written. Then record the (resumable) config and drop stale temp files."""
    try:
        loop.open_resume(path)
    except ConfigError:
        raise
    except (KeyError, ValueError, RuntimeError, TypeError, IndexError, AttributeError) as err:
        raise CheckpointError(f"checkpoint {path / CHECKPOINT} does not fit this run's config "
                              f"({type(err).__name__}: {one_line(err, 160)}); nothing was changed") from None
    write_config(cfg, loop.kind, path)
    remove_stale_temp_files(path)
