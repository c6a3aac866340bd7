"""``python -m sac_spectral.sweep --config SWEEP.yaml [--dry-run] [--retry-failed] [--address ADDR] [key=value ...]``

A study: methods × tasks × seeds, every trial an ordinary run of ``python -m sac_spectral.train``
(or ``continual``) in its own process, scheduled on Ray — a local instance started here, or a
running cluster with ``--address`` (or ``RAY_ADDRESS``). Re-running the same command skips finished
trials, resumes interrupted ones from their checkpoints and retries failed ones only with
``--retry-failed``; Ctrl-C stops every running trial at a checkpoint.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

import sac_spectral
from sac_spectral.core.config import ConfigError, help_text, one_line, yaml_load
from sac_spectral.runs.cli import parse_cli
from sac_spectral.runs.layout import SUMMARY
from sac_spectral.runs.run import BAR_FORMAT, GracefulStop
from sac_spectral.studies import trial as trial_module
from sac_spectral.studies.cost import dry_run
from sac_spectral.studies.spec import (
    BASE_FILE,
    LOCK,
    LOGS,
    SWEEP_FILE,
    Resources,
    Sweep,
    SweepConfig,
    Trial,
    check_compatible,
    invalid_trials,
    load_sweep,
)
from sac_spectral.studies.status import Status, read_status
from sac_spectral.studies.trial import run_trial, trial_state

CODE_ROOT = str(Path(sac_spectral.__file__).resolve().parents[1])
#: seconds for the port of ``--address`` to accept a connection, and then for Ray to connect
REACH_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 90.0  # Ray refuses a missing auth token after ≈ 20 s


def _spec(sweep: Sweep, root: Path, trial: Trial) -> dict[str, Any]:
    return {
        "kind": sweep.cfg.kind, "base": str(root / BASE_FILE), "overrides": trial.overrides,
        "run_dir": str(root / trial.id), "log": str(root / LOGS / f"{trial.id}.log"),
        "threads": sweep.cfg.resources_per_trial.cpu, "code_root": CODE_ROOT, "cwd": os.getcwd(),
    }


def _start_ray(address: str | None, num_cpus: int | None) -> bool:
    """Connect to ``address`` or start a local instance; False if Ray was already initialized here."""
    try:
        import ray
    except ImportError:
        raise ConfigError("the sweep runs on Ray, which is not installed; pip install -e '.[sweep]'") from None
    # Ray ships run_trial to its workers by value, so a worker needs neither this package nor torch.
    ray.cloudpickle.register_pickle_by_value(trial_module)
    if ray.is_initialized():
        return False
    if address and num_cpus is not None:
        raise ConfigError("--num-cpus sizes a local Ray instance; a cluster (--address) has its own")
    if address:
        _connect(ray, address)
    else:
        # "local": a new instance even where a `ray start` cluster runs on this machine (address=None
        # would join that one, and refuse num_cpus)
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
    return True


def _connect(ray: Any, address: str) -> None:
    """Connect to a running cluster; a failure is one line with its likely cause and the fix.

    ``ray start --head`` (Ray >= 2.59) turns token authentication on where ``~/.ray/auth_token``
    exists (any earlier local ``ray.init()`` writes it); a process connecting to an explicit address
    sends its token only with RAY_AUTH_MODE=token, which the sweep leaves to the user, as Ray does,
    so that a local token never goes to another cluster unasked."""
    try:
        _init_watched(ray, address)
    except ConnectionError as err:
        mode = os.environ.get("RAY_AUTH_MODE")
        cause = ("check that RAY_AUTH_TOKEN or ~/.ray/auth_token here holds the cluster's token" if mode == "token" else
                 "if it runs, the likely cause is token authentication (Ray >= 2.59 turns it on where "
                 "~/.ray/auth_token "
                 "exists): set RAY_AUTH_MODE=token, with the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN, "
                 "for every `ray start` and for this command")
        raise ConfigError(f"cannot connect to the Ray cluster at {address} ({one_line(err)}; RAY_AUTH_MODE="
                          f"{mode or 'unset'}); {cause}") from None


def _check_address(address: str) -> None:
    """Refuse an address other than ``auto``, ``HOST:PORT`` and ``ray://HOST:PORT``, whose host does
    not resolve or whose port accepts no connection within REACH_TIMEOUT_S, in one line (``ray.init``
    would retry it for minutes, deaf to Ctrl-C)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or "://" in host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"the Ray address '{address}' (--address or RAY_ADDRESS) is not auto, HOST:PORT or "
                          "ray://HOST:PORT (PORT 1-65535); leave both unset for a local Ray instance")
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
    except socket.gaierror as err:
        raise ConfigError(f"cannot resolve the host of the Ray address {address} ({err.strerror}); "
                          "check the head node's name or IP") from None
    except OSError as err:
        option = "--ray-client-server-port" if address.startswith("ray://") else "--port"
        raise ConfigError(f"nothing accepts a connection at the Ray address {address} ({err.strerror or 'timed out'}); "
                          f"check that the head node runs `ray start --head {option}={port}` and that no firewall "
                          "blocks the port") from None


def _init_watched(ray: Any, address: str) -> None:
    """``ray.init(address)``; it blocks in Ray's C++ core, where no Python signal handler runs, so a
    thread woken through the signal wake-up fd ends the process at once on SIGINT or SIGTERM
    (128 + signal), and with exit code 2 when Ray has not connected within CONNECT_TIMEOUT_S."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write)
    watcher = threading.Thread(target=_watch, args=(read, address), daemon=True)
    watcher.start()
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    finally:
        signal.set_wakeup_fd(previous)
        os.write(write, b"\0")  # no signal has number 0: ray.init returned
        watcher.join()
        os.close(read)
        os.close(write)


def _watch(fd: int, address: str) -> None:
    """Wait for :func:`_init_watched`'s end (a 0 byte on ``fd``), a signal, or the deadline."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        for sig in os.read(fd, 64):
            if sig == 0:
                return
            if sig in (signal.SIGINT, signal.SIGTERM):
                _exit_now(128 + sig, f"interrupted while connecting to the Ray cluster at {address}; no trial started")
    _exit_now(2, f"no Ray cluster answered at {address} within {CONNECT_TIMEOUT_S:g} s; check that its port is the "
                 "head's `ray start --head --port` (default 6379; ray://: 10001), not the dashboard's (8265) or "
                 "another service's")


def _exit_now(code: int, message: str) -> None:
    """End the process from any thread, with one ``error:`` line."""
    os.write(2, f"error: {message}\n".encode())
    os._exit(code)


def _check_capacity(res: Resources) -> None:
    import ray

    have = ray.cluster_resources()
    for key, need in (("CPU", res.cpu), ("GPU", res.gpu)):
        if need > 0 and have.get(key, 0) < need:
            raise ConfigError(f"resources_per_trial asks for {need} {key} per trial but the Ray cluster has "
                              f"{have.get(key, 0):g}")


def run_sweep(sweep: Sweep, root: Path, retry_failed: bool, address: str | None, num_cpus: int | None,
              progress: bool) -> int:
    """Run every unfinished trial on Ray; returns 0 (all done), 1 (some failed) or 128 + signal."""
    status = Status(sweep, root, read_status(root))
    todo = [t for t in sweep.trials if status.trials[t.id]["status"] == "pending"
            or (retry_failed and status.trials[t.id]["status"] == "failed")]
    invalid = invalid_trials(sweep)
    for t in todo:
        if t.id in invalid:
            status.set(t.id, status="failed", error=invalid[t.id], exit_code=2, command=None)
        else:
            status.set(t.id, status="pending")
    todo = [t for t in todo if t.id not in invalid]
    status.write()
    if todo:
        owner = _start_ray(address, num_cpus)
        try:
            _check_capacity(sweep.cfg.resources_per_trial)
            code = _drive(sweep, root, status, todo, progress)
        finally:
            if owner:
                import ray

                ray.shutdown()
        if code:
            return code
    counts = status.counts()
    print(f"sweep {root}: {counts['done']} done, {counts['failed']} failed, {counts['pending']} pending\n"
          f"report:  python -m sac_spectral.report {root}")
    for tid, entry in status.trials.items():
        if entry["status"] == "failed":
            print(f"failed: {tid}: {entry['error']}  (log: {root / entry['log']})", file=sys.stderr)
    return 1 if counts["failed"] else 0


def _record(status: Status, bar: tqdm, run_dir: Path, tid: str, event: dict[str, Any], stopping: bool) -> None:
    """Record a trial's ``started`` or ended ``event`` in ``status`` and on the progress bar: an
    ended trial is done (exit 0 and its summary written), pending again (stopped by the sweep's
    own stop) or failed."""
    if event["event"] == "started":
        status.set(tid, status="running", command=event["command"], host=event["host"], node=event["node"],
                   pid=event["pid"], error=None, exit_code=None)
        return
    code = event["exit_code"]
    if code == 0 and trial_state(run_dir) == "done":
        status.set(tid, status="done", exit_code=0, wall_s=event["wall_s"], error=None)
        bar.update(1)
        bar.write(f"done    {tid} ({event['wall_s']:.0f} s)")
    elif code in (128 + signal.SIGINT, 128 + signal.SIGTERM) and stopping:
        status.set(tid, status="pending", exit_code=code)
    else:
        error = event["error"] or f"exit code 0 but no {SUMMARY} in the run directory"
        status.set(tid, status="failed", exit_code=code, error=error, wall_s=event["wall_s"])
        bar.write(f"failed  {tid}: {error}")


def _drive(sweep: Sweep, root: Path, status: Status, todo: list[Trial], progress: bool) -> int:
    import ray
    from ray.exceptions import RayError, TaskCancelledError

    res = sweep.cfg.resources_per_trial
    task = ray.remote(run_trial).options(num_cpus=res.cpu, num_gpus=res.gpu)
    gens = {task.remote(_spec(sweep, root, t)): t.id for t in todo}
    counts = status.counts()
    # no time-left estimate: trials differ in length, and a count of finished ones does not tell
    bar = tqdm(total=len(sweep.trials), initial=counts["done"], unit="trial", disable=not progress,
               dynamic_ncols=True, mininterval=1.0, bar_format=BAR_FORMAT)

    with GracefulStop() as stop:
        cancelled = False
        while gens:
            if stop.requested is not None and not cancelled:
                for gen in gens:
                    ray.cancel(gen)
                cancelled = True
            ready, _ = ray.wait(list(gens), num_returns=len(gens), timeout=0.5)
            for gen in ready:
                tid = gens[gen]
                try:
                    event = ray.get(next(gen))
                except StopIteration:
                    del gens[gen]
                    continue
                except TaskCancelledError:
                    del gens[gen]
                    done = trial_state(root / tid) == "done"
                    status.set(tid, status="done" if done else "pending")
                    bar.update(int(done))
                    continue
                except RayError as err:
                    del gens[gen]
                    status.set(tid, status="failed",
                               error=f"ray: {type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}")
                    bar.write(f"failed  {tid}: {status.trials[tid]['error']}")
                    continue
                _record(status, bar, root / tid, tid, event, stop.requested is not None)
            if ready:
                status.write()
            c = status.counts()
            bar.set_postfix(running=c["running"], pending=c["pending"], failed=c["failed"], refresh=False)
            bar.update(0)
        status.write()
        bar.close()
        if stop.requested is not None:
            n = status.counts()["pending"]
            print(f"sweep stopped: {n} unfinished trial(s) keep their checkpoints; run the same command to continue",
                  file=sys.stderr)
            return 128 + stop.requested
    return 0


def _sweep_dir(sweep: Sweep, out: str) -> Path:
    return Path(out).resolve() / str(sweep.cfg.name)


def _check_dir(sweep: Sweep, root: Path) -> None:
    """Refuse a sweep directory that holds another study, or a folder with other files (reads only)."""
    if (root / SWEEP_FILE).is_file():
        check_compatible(sweep, yaml_load((root / SWEEP_FILE).read_text()) or {}, root)
    elif root.exists() and (not root.is_dir() or any(p.name != LOCK for p in root.iterdir())):
        raise ConfigError(f"'{root}' exists and is not a sweep directory (no {SWEEP_FILE}); choose another name= or "
                          "--out")


def _write_spec(sweep: Sweep, root: Path) -> None:
    """The resolved ``sweep.yaml`` and ``base.yaml`` of the sweep directory."""
    (root / SWEEP_FILE).write_text(yaml.safe_dump(sweep.resolved(), sort_keys=False))
    (root / BASE_FILE).write_text(yaml.safe_dump(sweep.base, sort_keys=False))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sac_spectral.sweep", description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="sweep file keys (override with key=value, nested keys dotted):\n" + help_text(SweepConfig),
    )
    parser.add_argument("--config", metavar="FILE", required=True, help="the sweep file (YAML)")
    parser.add_argument("--out", default="runs", help="parent folder of the sweep's directory (default: runs)")
    parser.add_argument("--dry-run", action="store_true", help="list the trials and their estimated cost; run nothing")
    parser.add_argument("--retry-failed", action="store_true", help="run failed trials again (resuming any checkpoint)")
    parser.add_argument("--address",
                        help="a running Ray cluster: auto, HOST:PORT or ray://HOST:PORT (default: $RAY_ADDRESS, else a "
                             "local instance)")
    parser.add_argument("--num-cpus", type=int, help="CPUs of the local Ray instance (default: all)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="sweep file overrides, e.g. seeds=[0,1] base.total_steps=1000")
    args = parse_cli(parser, argv, ("--config", "--out", "--address", "--num-cpus"))
    sweep = load_sweep(args.config, args.overrides)
    root = _sweep_dir(sweep, args.out)
    if args.dry_run:
        if (root / SWEEP_FILE).is_file():
            check_compatible(sweep, yaml_load((root / SWEEP_FILE).read_text()) or {}, root)
        return dry_run(sweep, root, args.retry_failed, args.num_cpus)
    address = args.address or os.environ.get("RAY_ADDRESS")
    if address:
        _check_address(address)
    _check_dir(sweep, root)
    root.mkdir(parents=True, exist_ok=True)
    # The lock comes first: a second sweep process on this directory is refused before it writes.
    with (root / LOCK).open("a") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"another sweep process is running on {root}") from None
        _check_dir(sweep, root)
        _write_spec(sweep, root)
        return run_sweep(sweep, root, args.retry_failed, address, args.num_cpus, not args.no_progress)
