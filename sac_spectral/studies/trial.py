"""One trial of a sweep, as a Ray task: its state on disk, its runner command line, the runner's
process (through a launcher that ties it to its worker) and the line that says why it failed.

Ray ships :func:`run_trial` to its workers by value (the sweep registers this module so), so this
module uses only the standard library, PyYAML (which Ray needs too) and plain values of the
package: a worker needs neither ``sac_spectral`` nor torch."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from sac_spectral.core.config import ConfigError
from sac_spectral.runs.kinds import get_kind, run_kind
from sac_spectral.runs.layout import CHECKPOINT, CONFIG_FILE, SUMMARY, written_by_a_run

# The trial's process is started through this launcher: it asks Linux to send it SIGTERM when its
# parent (the Ray worker) dies, so that no trial outlives its sweep, however the sweep ends (the
# runner checkpoints and stops on SIGTERM), then replaces itself with the runner (exec keeps that).
LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"
    "    if os.getppid() != int(sys.argv[1]):\n"
    "        os._exit(128 + signal.SIGTERM)\n"
    "os.execv(sys.executable, [sys.executable] + sys.argv[2:])\n"
)



def finished(run_dir: Path) -> bool:
    """The run wrote its summary: ``summary.json`` parses and names the run of ``config.yaml``
    (:attr:`RunKind.names_run <sac_spectral.runs.kinds.RunKind>`: an RL run's env and seeds, a
    continual run's seed and stream)."""
    try:
        summary = json.loads((run_dir / SUMMARY).read_text())
        config = yaml.safe_load((run_dir / CONFIG_FILE).read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return False
    if not isinstance(summary, dict) or not isinstance(config, dict):
        return False
    try:
        kind = get_kind(run_kind(config, summary))
    except ConfigError:
        return False
    return kind.names_run(summary, config)


def trial_state(run_dir: Path) -> str:
    """``done`` (a summary of its config written), ``resume`` (a checkpoint) or ``fresh``."""
    if finished(run_dir):
        return "done"
    return "resume" if (run_dir / CHECKPOINT).is_file() else "fresh"


def trial_command(spec: Mapping[str, Any], state: str) -> list[str]:
    """The runner command line of a trial: a fresh run of the base config with the trial's
    overrides, or ``--resume`` of its run directory."""
    run = [f"threads={spec['threads']}", "progress=false"]
    head = [sys.executable, "-m", get_kind(spec["kind"]).runner]
    if state == "resume":
        return [*head, "--resume", spec["run_dir"], *run]
    return [*head, "--config", spec["base"], *spec["overrides"], f"run_dir={spec['run_dir']}", *run]


def error_line(log: Path, start: int, code: int) -> str:
    """The one line that says why a trial failed: the runner's ``error: …`` line, the last line of
    its output (a traceback's exception), or the signal that killed it."""
    lines = [ln.strip() for ln in log.read_bytes()[start:].decode(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    if errors:
        return errors[-1][:500]
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return (lines[-1][:500] if lines else "no output") + f" (exit code {code})"


def _lock(f: Any) -> None:
    """Exclusive lock on a trial's log: a trial process of an earlier, killed sweep holds it (as its
    stdout) until it has checkpointed and exited, so one run directory never has two writers."""
    while True:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.5)


def node_id() -> str | None:
    """The id of the Ray node this task runs on (None outside Ray)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def run_trial(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The Ray task of one trial (a generator): yields ``started`` when the runner process starts,
    then ``finished`` with its exit code and error line. Cancelling the task (Ctrl-C of the sweep)
    sends the runner SIGTERM: it checkpoints and exits."""
    # Ray cancels a running task by raising KeyboardInterrupt in it, which needs Python's SIGINT
    # handler (a sweep started in the background by a shell inherits SIGINT ignored); the caller's
    # handler is back once the trial ends.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield from _run(spec)
    finally:
        signal.signal(signal.SIGINT, previous)


def _run(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The body of :func:`run_trial`, under Python's SIGINT handler."""
    run_dir, log = Path(spec["run_dir"]), Path(spec["log"])
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        _lock(out)
        state = trial_state(run_dir)
        if state == "done":
            yield {"event": "finished", "exit_code": 0, "error": None, "wall_s": 0.0}
            return
        if state == "fresh" and run_dir.exists():
            if not written_by_a_run(run_dir):
                error = (f"error: run directory {run_dir} holds files a run does not write; the sweep leaves them "
                         "alone: move them away, then run the sweep again")
                out.write(f"{error}\n".encode())
                yield {"event": "finished", "exit_code": 2, "error": error, "wall_s": 0.0}
                return
            shutil.rmtree(run_dir)  # an attempt killed before its first checkpoint
        cmd = trial_command(spec, state)
        start = out.seek(0, os.SEEK_END)
        out.write(f"=== {datetime.now():%Y-%m-%d %H:%M:%S} on {socket.gethostname()}: {shlex.join(cmd)}\n".encode())
        out.flush()
        env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "MKL_NUM_THREADS": str(spec["threads"])}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (spec["code_root"], os.environ.get("PYTHONPATH")) if p)
        cwd = spec["cwd"] if Path(spec["cwd"]).is_dir() else None
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(os.getpid()), *cmd[1:]], stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True,
        )
    yield {"event": "started", "state": state, "host": socket.gethostname(), "node": node_id(), "pid": proc.pid,
           "command": shlex.join(cmd)}
    try:
        while proc.poll() is None:
            time.sleep(0.2)
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        raise
    code = proc.returncode
    yield {"event": "finished", "exit_code": code, "error": None if code == 0 else error_line(log, start, code),
           "wall_s": time.monotonic() - t0}
