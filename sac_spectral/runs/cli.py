"""The runners' command line: parser, ``key=value`` overrides, the resolved config of a fresh or
resumed run, threads and device, and :func:`run_cli`, which turns errors into one line.

Exit codes: 0 done; 2 bad input (a one-line ``error: …``, nothing written or overwritten); 1 a
non-finite run, a full disk or another I/O failure (the last good checkpoint is kept);
128 + the signal after SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import re
import signal
import stat
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from sac_spectral.core.config import (
    ConfigError,
    describe,
    flatten,
    help_text,
    merge_sources,
    one_line,
    parse_override,
    read_yaml,
    to_dict,
)
from sac_spectral.core.threads import allowed_cores, check_threads, choose_threads
from sac_spectral.runs.checkpoint import NO_SPACE, checkpoint_config
from sac_spectral.runs.layout import CHECKPOINT, CONFIG_FILE
from sac_spectral.runs.rundir import is_unstarted_run_dir, lookup

T = TypeVar("T")


#: a ``key=value`` override on the command line (a key never starts with ``-`` or ``=``)
OVERRIDE = re.compile(r"^[^-=][^=]*=")



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
    dotted = next((key for key, tp, _, _ in describe(cls) if "." in key and key.endswith(".lr") and tp == "float"),
                  None)
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


def parse_cli(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
              value_options: Iterable[str]) -> argparse.Namespace:
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
    found = lookup(run_dir, "--resume")
    if found is None or not stat.S_ISDIR(found.st_mode):
        what = "is a file, not a run directory" if found is not None else "no such run directory"
        raise ConfigError(f"cannot resume '{run_dir}': {what}")
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"cannot resume '{run_dir}': {run_dir / CONFIG_FILE} is missing")
    allowed = set(resumable)
    for text in args.overrides:
        key = ".".join(parse_override(text)[0])
        if key not in allowed:
            raise ConfigError(f"'{key}' cannot change on --resume; resumable keys: "
                              f"{', '.join(sorted(allowed)) or 'none'}")
    data = read_yaml(run_dir / CONFIG_FILE)
    try:
        before = merge_sources(cls, data)
    except ConfigError as err:
        raise ConfigError(f"{run_dir / CONFIG_FILE}: {err}") from None
    cfg = merge_sources(cls, data, args.overrides)
    for text in args.overrides:
        check_takes_effect(cls, data, before, text)
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


def check_takes_effect(cls: type, data: Mapping[str, Any], before: Any, text: str) -> None:
    """Refuse the override ``text`` on the config ``before`` (``cls`` from ``data``) where it asks for a
    new value and the config's own rules overrule it (a key the config derives from others)."""
    path, value = parse_override(text)
    key = ".".join(path)
    was = flatten(to_dict(before)).get(key)
    if value != was and to_dict(merge_sources(cls, data, [text])) == to_dict(before):
        why = {row[0]: row[3] for row in describe(cls)}.get(key, "")
        raise ConfigError(f"{text} would not take effect: this run's config derives {key} ({was}) from its other keys "
                          f"({why})")


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


def set_torch_threads(requested: int) -> str:
    """Give torch ``requested`` CPU threads, or with 0 the cores other processes left idle while this
    one started (:mod:`sac_spectral.core.threads`). Returns how many and why, for the run's summary line.
    A count beyond the cores this process may use is a :class:`ConfigError`."""
    check_threads(requested)
    threads, why = choose_threads(requested, torch.get_num_threads())
    torch.set_num_threads(threads)
    plural = "s" * (threads > 1)
    if requested == 0 and threads < len(allowed_cores()):
        return f"{threads} thread{plural} (threads=0: {why}; set threads=N to choose)"
    return f"{threads} thread{plural}"



def describe_os_error(err: OSError) -> str:
    """``disk full (No space left on device) writing FILE`` or ``I/O error (…) on FILE``."""
    what = "disk full" if err.errno in NO_SPACE else "I/O error"
    where = f" writing {err.filename}" if err.filename else ""
    return f"{what} ({err.strerror or err}){where}"


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
        print(f"error: out of memory ({one_line(err, 160)}); reduce the batch, buffer or network sizes",
              file=sys.stderr)
        return 1
