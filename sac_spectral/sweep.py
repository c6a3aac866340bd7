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
import itertools
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

import sac_spectral
from sac_spectral.core.config import (
    ConfigError,
    check,
    flatten,
    help_text,
    merge_sources,
    option,
    read_yaml,
    section,
    to_dict,
    yaml_load,
)
from sac_spectral.runs.checkpoint import write_json
from sac_spectral.runs.cli import parse_cli, run_cli
from sac_spectral.runs.layout import CHECKPOINT, SUMMARY
from sac_spectral.runs.run import GracefulStop

SWEEP_FILE, BASE_FILE, STATUS, LOGS, LOCK = "sweep.yaml", "base.yaml", "status.json", "logs", ".sweep.lock"
RUNNERS = {"train": "sac_spectral.train", "continual": "sac_spectral.continual"}
TASK_KEYS = {"train": ["env"], "continual": ["dataset.name", "stream.kind"]}
RESERVED = ("seed", "num_seeds", "run_dir", "threads", "progress")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
CODE_ROOT = str(Path(sac_spectral.__file__).resolve().parents[1])
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


@dataclass
class Resources:
    cpu: int = option(1, "CPU cores per trial; the trial runs with threads=cpu")
    gpu: float = option(0.0, "GPUs per trial (a fraction shares one GPU); the base config sets device: cuda")

    def validate(self) -> None:
        check(self.cpu >= 1, "cpu", f"must be an integer >= 1, got {self.cpu}")
        check(self.gpu >= 0, "gpu", f"must be >= 0, got {self.gpu}")


@dataclass
class SweepConfig:
    kind: str = option("train", f"the runner of every trial: {' | '.join(RUNNERS)}")
    name: str | None = option(None, "the sweep's folder under --out (default: the sweep file's name)")
    base: Any = option({}, "run config shared by all trials: a YAML file, or keys with an optional 'config: FILE'")
    methods: dict[str, Any] = option({}, "named override sets (dotted keys), e.g. {sac: {critic.regularizers: []}}")
    grid: dict[str, Any] = option({}, "lists of values of run keys, e.g. {env: [dmc:cheetah-run]}; every combination is run")
    seeds: list[int] = option([0], "seeds of every method and grid point")
    seeds_per_trial: int = option(1, "consecutive seeds one trial trains together as num_seeds members (train only)")
    resources_per_trial: Resources = section(Resources, "what Ray reserves for one trial")
    task_keys: list[str] | None = option(None, "run keys that name a task in reports (default: env | dataset.name, stream.kind)")

    def validate(self) -> None:
        check(self.kind in RUNNERS, "kind", f"'{self.kind}' is not one of {', '.join(RUNNERS)}")
        check(self.name is None or bool(NAME.match(self.name)), "name", f"'{self.name}' must be a plain folder name")
        check(isinstance(self.base, (str, dict)), "base", f"expected a file name or a mapping of run keys, got {self.base!r}")
        check(bool(self.methods), "methods", "give at least one named override set, e.g. {spectral: {}}")
        for name, overrides in self.methods.items():
            check(bool(NAME.match(str(name))), "methods", f"'{name}' must be a plain name (letters, digits, _ . + -)")
            check(overrides is None or isinstance(overrides, dict), f"methods.{name}", f"expected a mapping of run keys, got {overrides!r}")
        for key, values in self.grid.items():
            check(isinstance(values, list) and len(values) > 0, f"grid.{key}", f"expected a non-empty list of values, got {values!r}")
        check(len(self.seeds) > 0 and len(set(self.seeds)) == len(self.seeds), "seeds", f"expected distinct seeds, got {self.seeds}")
        check(self.seeds_per_trial >= 1, "seeds_per_trial", f"must be >= 1, got {self.seeds_per_trial}")
        check(self.kind == "train" or self.seeds_per_trial == 1, "seeds_per_trial",
              "continual runs train one seed each; use 1")


@dataclass
class Trial:
    """One run of the sweep: its name (the run directory's path in the sweep), what it overrides."""

    id: str
    method: str
    point: dict[str, Any]
    seeds: list[int]
    overrides: list[str]


@dataclass
class Sweep:
    """A resolved sweep file: the shared base config and every trial."""

    cfg: SweepConfig
    base: dict[str, Any]
    methods: dict[str, dict[str, Any]]
    task_keys: list[str]
    trials: list[Trial] = field(default_factory=list)

    def resolved(self) -> dict[str, Any]:
        """What ``sweep.yaml`` holds: the file with its base read and every override dotted."""
        out = to_dict(self.cfg)
        out.update(base=self.base, methods=self.methods, task_keys=self.task_keys)
        return out


# --------------------------------------------------------------------------------------- sweep file
def _dump(value: Any) -> str:
    """A value as the runners' ``key=value`` command line parses it back."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip().removesuffix("...").strip()


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """``b`` merged into ``a``, recursively for mappings in both."""
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _nest(data: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys → nested mappings (``{'a.b': 1, 'a': {'c': 2}}`` → ``{'a': {'b': 1, 'c': 2}}``)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        value = _nest(value) if isinstance(value, Mapping) else value
        for part in reversed(str(key).split(".")):
            value = {part: value}
        out = _merge(out, value)
    return out


def _slug(value: Any) -> str:
    text = value if isinstance(value, str) else _dump(value)
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", text.replace(":", "-")).strip("-") or "-"


def _seed_label(seeds: Sequence[int]) -> str:
    return f"s{seeds[0]}" if len(seeds) == 1 else f"s{seeds[0]}-{seeds[-1]}"


def _check_reserved(keys: Sequence[str], where: str) -> None:
    for key in keys:
        check(key.split(".")[0] not in RESERVED, where,
              f"'{key}' is set by the sweep for every trial (seeds: and resources_per_trial: choose it)")


def load_sweep(path: str, overrides: Sequence[str]) -> Sweep:
    """Read, validate and expand a sweep file into its trials."""
    data = read_yaml(path)
    if isinstance(data.get("base"), str):
        data["base"] = {"config": data["base"]}
    cfg = merge_sources(SweepConfig, data, overrides)
    if cfg.name is None:
        cfg.name = Path(path).stem if Path(path).name != SWEEP_FILE else Path(path).resolve().parent.name
    raw_base = dict(cfg.base) if isinstance(cfg.base, dict) else {"config": cfg.base}
    base_file = raw_base.pop("config", None)
    _check_reserved(list(flatten(_nest(raw_base))), "base")
    # A full run config as base (e.g. run_configs/continual_default.yaml) names a seed, run_dir, …:
    # every trial sets its own, so the file's are dropped.
    from_file = _nest(read_yaml(base_file)) if base_file is not None else {}
    base = _merge({k: v for k, v in from_file.items() if k not in RESERVED}, _nest(raw_base))
    methods = {str(m): flatten(_nest(o or {})) for m, o in cfg.methods.items()}
    for name, keys in methods.items():
        _check_reserved(list(keys), f"methods.{name}")
    _check_reserved(list(cfg.grid), "grid")
    task_keys = cfg.task_keys if cfg.task_keys is not None else TASK_KEYS[cfg.kind]
    sweep = Sweep(cfg, base, methods, list(task_keys))
    chunks: list[list[int]] = []
    for i in range(0, len(cfg.seeds), cfg.seeds_per_trial):
        chunk = list(cfg.seeds[i:i + cfg.seeds_per_trial])
        check(chunk == list(range(chunk[0], chunk[0] + len(chunk))), "seeds",
              f"seeds packed into one trial must be consecutive (num_seeds trains seed, seed + 1, …), got {chunk}")
        chunks.append(chunk)
    grid_keys = list(cfg.grid)
    seen: dict[str, Trial] = {}
    for method, keys in methods.items():
        for values in itertools.product(*(cfg.grid[k] for k in grid_keys)):
            point = dict(zip(grid_keys, values))
            parts = [_slug(v) if k == "env" else f"{k}={_slug(v)}" for k, v in point.items()]
            for chunk in chunks:
                tid = "/".join([method, *parts, _seed_label(chunk)])
                check(tid not in seen, "grid", f"two trials would share the run directory '{tid}'; make the values distinct")
                over = [f"{k}={_dump(v)}" for k, v in {**keys, **point}.items()] + [f"seed={chunk[0]}"]
                if len(chunk) > 1:
                    over.append(f"num_seeds={len(chunk)}")
                seen[tid] = Trial(tid, method, point, chunk, over)
    sweep.trials = list(seen.values())
    return sweep


def check_compatible(sweep: Sweep, saved: Mapping[str, Any], where: Path) -> None:
    """A sweep directory holds one study: its kind, base, seed packing and the override sets of its
    existing methods must not change (new methods, grid values and seeds may be added)."""
    new = sweep.resolved()
    for key in ("kind", "base", "seeds_per_trial"):
        if saved.get(key) != new[key]:
            raise ConfigError(f"{where} holds a sweep with a different '{key}'; give this one another name= or --out")
    for method, keys in new["methods"].items():
        old = (saved.get("methods") or {}).get(method)
        if old is not None and old != keys:
            raise ConfigError(f"{where} holds a sweep whose method '{method}' has other overrides; rename the method or the sweep")


def invalid_trials(sweep: Sweep) -> dict[str, str]:
    """``{trial: error line}`` of the trials whose run config does not validate, checked here with
    the runner's own config classes. The device is checked where the trial runs (a CPU-only head
    node may drive GPU trials), so it is set to cpu for this check."""
    if sweep.cfg.kind == "train":
        from sac_spectral.train import TrainConfig as cls
    else:
        from sac_spectral.continual import ContinualConfig as cls
    errors = {}
    for t in sweep.trials:
        try:
            merge_sources(cls, sweep.base, [*t.overrides, "device=cpu"])
        except ConfigError as err:
            errors[t.id] = f"error: {err}"
    return errors


# --------------------------------------------------------------------------------------- one trial
def trial_state(run_dir: Path) -> str:
    """``done`` (summary written), ``resume`` (a checkpoint) or ``fresh``."""
    if (run_dir / SUMMARY).is_file():
        return "done"
    return "resume" if (run_dir / CHECKPOINT).is_file() else "fresh"


def trial_command(spec: Mapping[str, Any], state: str) -> list[str]:
    """The runner command line of a trial: a fresh run of the base config with the trial's
    overrides, or ``--resume`` of its run directory."""
    run = [f"threads={spec['threads']}", "progress=false"]
    head = [sys.executable, "-m", RUNNERS[spec["kind"]]]
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


def run_trial(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The Ray task of one trial (a generator): yields ``started`` when the runner process starts,
    then ``finished`` with its exit code and error line. Cancelling the task (Ctrl-C of the sweep)
    sends the runner SIGTERM: it checkpoints and exits."""
    # Ray cancels a running task by raising KeyboardInterrupt in it, which needs Python's SIGINT
    # handler (a sweep started in the background by a shell inherits SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    run_dir, log = Path(spec["run_dir"]), Path(spec["log"])
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        _lock(out)
        state = trial_state(run_dir)
        if state == "done":
            yield {"event": "finished", "exit_code": 0, "error": None, "wall_s": 0.0}
            return
        if state == "fresh" and run_dir.exists():
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
    yield {"event": "started", "state": state, "host": socket.gethostname(), "pid": proc.pid, "command": shlex.join(cmd)}
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


# --------------------------------------------------------------------------------------- the driver
class Status:
    """``status.json``: every trial's state (pending / running / done / failed), error line, run
    directory and command; written atomically by the sweep process whenever something changes."""

    def __init__(self, sweep: Sweep, root: Path, previous: Mapping[str, Any]) -> None:
        self.root, self.sweep = root, sweep
        old = previous.get("trials", {})
        self.trials: dict[str, dict[str, Any]] = {}
        for t in sweep.trials:
            entry = {"status": "pending", "method": t.method, "task": t.point, "seeds": t.seeds, "run_dir": t.id,
                     "log": f"{LOGS}/{t.id}.log", "command": None, "error": None, "exit_code": None, "wall_s": None}
            prev = old.get(t.id, {})
            entry.update({k: prev[k] for k in ("command", "error", "exit_code", "wall_s") if k in prev})
            state = trial_state(root / t.id)
            entry["status"] = "done" if state == "done" else "failed" if prev.get("status") == "failed" else "pending"
            self.trials[t.id] = entry

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(("done", "running", "pending", "failed"), 0)
        for entry in self.trials.values():
            out[entry["status"]] += 1
        return out

    def set(self, tid: str, **values: Any) -> None:
        self.trials[tid].update(values)

    def write(self) -> None:
        write_json(self.root / STATUS, {
            "sweep": self.sweep.cfg.name, "kind": self.sweep.cfg.kind, "updated": datetime.now().isoformat(timespec="seconds"),
            "counts": self.counts(), "trials": self.trials,
        })


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
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address and num_cpus is not None:
        raise ConfigError("--num-cpus sizes a local Ray instance; a cluster (--address) has its own")
    kwargs: dict[str, Any] = {"address": address} if address else {"num_cpus": num_cpus, "include_dashboard": False}
    ray.init(**kwargs, log_to_driver=False, logging_level=logging.WARNING)
    return True


def _check_capacity(res: Resources) -> None:
    import ray

    have = ray.cluster_resources()
    for key, need in (("CPU", res.cpu), ("GPU", res.gpu)):
        if need > 0 and have.get(key, 0) < need:
            raise ConfigError(f"resources_per_trial asks for {need} {key} per trial but the Ray cluster has {have.get(key, 0):g}")


def run_sweep(sweep: Sweep, root: Path, retry_failed: bool, address: str | None, num_cpus: int | None,
              progress: bool) -> int:
    """Run every unfinished trial on Ray; returns 0 (all done), 1 (some failed) or 128 + signal."""
    previous = json.loads((root / STATUS).read_text()) if (root / STATUS).is_file() else {}
    status = Status(sweep, root, previous)
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


def _drive(sweep: Sweep, root: Path, status: Status, todo: list[Trial], progress: bool) -> int:
    import ray
    from ray.exceptions import RayError, TaskCancelledError

    res = sweep.cfg.resources_per_trial
    task = ray.remote(run_trial).options(num_cpus=res.cpu, num_gpus=res.gpu)
    gens = {task.remote(_spec(sweep, root, t)): t.id for t in todo}
    counts = status.counts()
    bar = tqdm(total=len(sweep.trials), initial=counts["done"], unit="trial", disable=not progress,
               dynamic_ncols=True, mininterval=1.0)

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
                    status.set(tid, status="failed", error=f"ray: {type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}")
                    bar.write(f"failed  {tid}: {status.trials[tid]['error']}")
                    continue
                if event["event"] == "started":
                    status.set(tid, status="running", command=event["command"], host=event["host"], pid=event["pid"],
                               error=None, exit_code=None)
                else:
                    code = event["exit_code"]
                    interrupted = code in (128 + signal.SIGINT, 128 + signal.SIGTERM) and stop.requested is not None
                    if code == 0 and trial_state(root / tid) == "done":
                        status.set(tid, status="done", exit_code=0, wall_s=event["wall_s"], error=None)
                        bar.update(1)
                        bar.write(f"done    {tid} ({event['wall_s']:.0f} s)")
                    elif interrupted:
                        status.set(tid, status="pending", exit_code=code)
                    else:
                        error = event["error"] or f"exit code 0 but no {SUMMARY} in the run directory"
                        status.set(tid, status="failed", exit_code=code, error=error, wall_s=event["wall_s"])
                        bar.write(f"failed  {tid}: {error}")
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


# --------------------------------------------------------------------------------------- dry run
def _measure(fn: Any, repeats: int = 3) -> float:
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


class CostModel:
    """Seconds a trial costs here: its updates (or iterations) times the measured time of one,
    plus its env steps (training and evaluation) times the measured time of one env step."""

    def __init__(self, threads: int) -> None:
        self.threads, self.cache = threads, {}

    def _cached(self, key: Any, fn: Any) -> Any:
        key = json.dumps(key, sort_keys=True, default=str)
        if key not in self.cache:
            self.cache[key] = fn()
        return self.cache[key]

    def train(self, cfg: Any) -> tuple[int, float]:
        import torch

        from agents import SAC, ReplayBuffer
        from envs import make_env
        from sac_spectral.core.seeding import SeedStreams

        updates = cfg.total_updates
        env = make_env(cfg.env, 0, cfg.action_repeat)
        obs_dim, act_dim = int(env.observation_space.shape[0]), int(env.action_space.shape[0])
        torch.set_num_threads(self.threads)

        def update_time() -> float:
            agent = SAC(obs_dim, act_dim, cfg, SeedStreams(list(range(cfg.num_seeds)), cfg.device), cfg.device)
            buf = ReplayBuffer(4 * cfg.batch_size, obs_dim, act_dim, cfg.num_seeds, cfg.device)
            m = cfg.num_seeds
            for _ in range(4 * cfg.batch_size):
                buf.add(torch.randn(m, obs_dim), torch.rand(m, act_dim) * 2 - 1, torch.randn(m), torch.randn(m, obs_dim), torch.zeros(m))
            agent.train_steps(buf, 2, cfg.batch_size)
            return _measure(lambda: agent.train_steps(buf, 4, cfg.batch_size)) / 4

        def env_step_time() -> float:
            env.reset(seed=0)

            def steps() -> None:
                for _ in range(100):
                    if any(env.step(env.action_space.sample())[2:4]):
                        env.reset()

            return _measure(steps) / 100

        agent_cfg = {k: v for k, v in to_dict(cfg).items() if k in ("actor", "critic", "alpha", "batch_size", "num_seeds", "device")}
        t_update = self._cached(["update", obs_dim, act_dim, agent_cfg], update_time)
        t_env = self._cached(["env", cfg.env, cfg.action_repeat], env_step_time)
        evals = 1 + (cfg.total_steps // cfg.eval_every + bool(cfg.total_steps % cfg.eval_every) if cfg.eval_every else 1)
        episode = (env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 1000)
        env_steps = cfg.num_seeds * (cfg.total_steps + evals * cfg.eval_episodes * episode)
        return updates, updates * t_update + env_steps * t_env

    def continual(self, cfg: Any) -> tuple[int, float]:
        import torch

        from sac_spectral.continual import ContinualRunner

        iterations = cfg.stream.num_tasks * cfg.stream.iters_per_task
        torch.set_num_threads(self.threads)

        def times() -> tuple[float, float]:
            runner = ContinualRunner(cfg)
            task = runner.stream.task(0)
            x, y = task.train_batch(runner.gen, cfg.batch_size, runner.dtype)
            runner.learner.train_step(x, y)
            t_iter = _measure(lambda: [runner.learner.train_step(x, y) for _ in range(5)]) / 5
            px, py = next(task.eval_batches("train", cfg.probe_size, cfg.probe_size, runner.dtype))

            def task_end() -> None:
                for split in ("train", "test"):
                    runner.learner.evaluate(task.eval_batches(split, 1024, cfg.eval_examples, runner.dtype))
                runner.learner.diagnose(px, py, 0, 0, True)

            return t_iter, _measure(task_end, repeats=1)

        key = {k: v for k, v in to_dict(cfg).items() if k not in ("seed", "run_dir", "threads", "progress", "stream")}
        key["stream"] = {k: v for k, v in to_dict(cfg.stream).items() if k != "num_tasks"}
        t_iter, t_task_end = self._cached(["iter", key], times)
        return iterations, iterations * t_iter + cfg.stream.num_tasks * t_task_end


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def dry_run(sweep: Sweep, root: Path, retry_failed: bool, num_cpus: int | None) -> int:
    """List the trials with their state and estimated cost; starts nothing, writes nothing."""
    import torch

    if sweep.cfg.kind == "train":
        from sac_spectral.train import TrainConfig as cls
    else:
        from sac_spectral.continual import ContinualConfig as cls
    res = sweep.cfg.resources_per_trial
    previous = json.loads((root / STATUS).read_text()) if (root / STATUS).is_file() else {}
    status, invalid = Status(sweep, root, previous), invalid_trials(sweep)
    device = "cuda" if res.gpu and torch.cuda.is_available() else "cpu"
    model = CostModel(res.cpu)
    unit = "updates" if sweep.cfg.kind == "train" else "iterations"
    width = max(len(t.id) for t in sweep.trials)
    print(f"{'trial':<{width}}  {'state':<8} {unit:>12}  {'estimate':>9}  note")
    total_updates, total_s, n_run = 0, 0.0, 0
    for t in sweep.trials:
        entry = status.trials[t.id]
        if t.id in invalid:
            print(f"{t.id:<{width}}  {'invalid':<8} {'':>12}  {'':>9}  {invalid[t.id]}")
            continue
        state = "resume" if entry["status"] == "pending" and trial_state(root / t.id) == "resume" else entry["status"]
        cfg = merge_sources(cls, sweep.base, [*t.overrides, f"threads={res.cpu}", f"device={device}"])
        updates, seconds = model.train(cfg) if sweep.cfg.kind == "train" else model.continual(cfg)
        if entry["status"] == "pending" or (retry_failed and entry["status"] == "failed"):
            total_updates, total_s, n_run = total_updates + updates, total_s + seconds, n_run + 1
        note = entry["error"] if entry["status"] == "failed" else ""
        print(f"{t.id:<{width}}  {state:<8} {updates:>12,}  {_duration(seconds):>9}  {note}")
    slots = max(1, (num_cpus or os.cpu_count() or 1) // res.cpu)
    print(f"\n{n_run} of {len(sweep.trials)} trials to run ({len(invalid)} invalid): {total_updates:,} {unit}, "
          f"≈ {_duration(total_s)} of trial time ({unit} and env steps timed here on {device} with {res.cpu} "
          f"thread(s); process start-up not counted), ≈ {_duration(total_s / min(slots, max(n_run, 1)))} "
          f"with {slots} trial(s) at a time on this machine")
    return 0


# --------------------------------------------------------------------------------------- CLI
def _sweep_dir(sweep: Sweep, out: str) -> Path:
    return Path(out).resolve() / str(sweep.cfg.name)


def _prepare(sweep: Sweep, root: Path) -> None:
    """Create or check the sweep directory and write the resolved ``sweep.yaml`` and ``base.yaml``."""
    if (root / SWEEP_FILE).is_file():
        check_compatible(sweep, yaml_load((root / SWEEP_FILE).read_text()) or {}, root)
    elif root.exists() and any(root.iterdir()):
        raise ConfigError(f"'{root}' exists and is not a sweep directory (no {SWEEP_FILE}); choose another name= or --out")
    root.mkdir(parents=True, exist_ok=True)
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
    parser.add_argument("--address", help="a running Ray cluster (e.g. auto or HOST:6379; default: $RAY_ADDRESS, else a local instance)")
    parser.add_argument("--num-cpus", type=int, help="CPUs of the local Ray instance (default: all)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="sweep file overrides, e.g. seeds=[0,1] base.total_steps=1000")
    args = parse_cli(parser, argv, ("--config", "--out", "--address", "--num-cpus"))
    sweep = load_sweep(args.config, args.overrides)
    root = _sweep_dir(sweep, args.out)
    if args.dry_run:
        if (root / SWEEP_FILE).is_file():
            check_compatible(sweep, yaml_load((root / SWEEP_FILE).read_text()) or {}, root)
        return dry_run(sweep, root, args.retry_failed, args.num_cpus)
    _prepare(sweep, root)
    with (root / LOCK).open("w") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"another sweep process is running on {root}") from None
        return run_sweep(sweep, root, args.retry_failed, args.address, args.num_cpus, not args.no_progress)


if __name__ == "__main__":
    sys.exit(run_cli(main))
