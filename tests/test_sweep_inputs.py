"""The sweep on bad or damaged inputs, without starting Ray: names that would escape ``--out``,
directories it did not create, a second sweep process, a garbage ``summary.json`` or ``status.json``,
env ids gymnasium registers but cannot build, and a Ray address where no cluster answers are one-line
errors or safe rebuilds."""

import fcntl
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sac_spectral.runs.cli import run_cli
from sac_spectral.studies import spec, sweep, trial
from sac_spectral.studies.status import Status, read_status
from sac_spectral.studies.trial import run_trial, trial_state

TINY = {
    "kind": "train",
    "base": {"env": "dmc:cartpole-balance", "random_steps": 50, "total_steps": 100, "eval_every": 0, "eval_episodes": 1,
             "batch_size": 8, "actor.hidden": [8], "critic.hidden": [8], "diagnostics.every": 0},
    "methods": {"sac": {}},
    "seeds": [0, 1],
}


def write_sweep(path: Path, data: dict | None = None) -> Path:
    path.write_text(yaml.safe_dump(data or TINY, sort_keys=False))
    return path


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def tree(path: Path) -> dict:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in path.rglob("*")}


# ----------------------------------------------------------------------------- names and paths
def test_a_sweep_file_name_that_is_not_a_folder_name_is_refused(tmp_path, capsys):
    out = tmp_path / "parent" / "out"
    out.mkdir(parents=True)
    keep = tmp_path / "parent" / "sac" / "s0"
    keep.mkdir(parents=True)
    (keep / "notes.txt").write_text("mine")
    cfg = write_sweep(tmp_path / "...yaml")
    before = tree(tmp_path / "parent")
    assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(out), "--no-progress"]) == 2
    assert "is not a plain folder name" in one_error_line(capsys)
    assert tree(tmp_path / "parent") == before


@pytest.mark.parametrize("grid", [{"env": [".."]}, {"env": ["."]}, {"env": ["dmc:cheetah-run", ".."]}])
def test_grid_values_cannot_name_dot_folders(tmp_path, capsys, grid):
    cfg = write_sweep(tmp_path / "g.yaml", {**TINY, "grid": grid})
    assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    assert "grid" in one_error_line(capsys)
    with pytest.raises(spec.ConfigError):
        spec.load_sweep(str(cfg), [])


def trial_spec(root: Path, tid: str) -> dict:
    return {"kind": "train", "base": str(root / "base.yaml"), "overrides": [], "run_dir": str(root / tid),
            "log": str(root / "logs" / f"{tid}.log"), "threads": 1, "code_root": str(root), "cwd": str(root)}


def test_a_trial_never_removes_a_directory_with_files_a_run_does_not_write(tmp_path):
    run_dir = tmp_path / "sac" / "s0"
    (run_dir / "sub").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("env: x\n")
    (run_dir / "sub" / "data.bin").write_bytes(b"mine")
    caller = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell's background job inherits it
    try:
        events = list(run_trial(trial_spec(tmp_path, "sac/s0")))
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "the trial left its SIGINT handler behind"
    finally:
        signal.signal(signal.SIGINT, caller)
    assert events == [{"event": "finished", "exit_code": 2, "wall_s": 0.0, "error": events[0]["error"]}]
    assert "holds files a run does not write" in events[0]["error"]
    assert (run_dir / "sub" / "data.bin").read_bytes() == b"mine"


def test_what_a_run_writes_before_its_first_checkpoint_may_be_removed(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    for name in ("config.yaml", "evals.csv", "events.out.tfevents.1.host", ".config.yaml.x1.tmp",
                 "checkpoints/.latest.pt.x2.tmp"):
        (tmp_path / name).write_text("")
    assert trial.written_by_a_run(tmp_path)
    (tmp_path / "checkpoints" / "other.pt").write_text("")
    assert not trial.written_by_a_run(tmp_path)


# ----------------------------------------------------------------------------- a second process
@pytest.mark.parametrize("existing", [False, True])
def test_a_refused_second_sweep_process_writes_nothing(tmp_path, capsys, existing):
    cfg = write_sweep(tmp_path / "tiny.yaml")
    root = tmp_path / "out" / "tiny"
    root.mkdir(parents=True)
    if existing:
        (root / "sweep.yaml").write_text(yaml.safe_dump(spec.load_sweep(str(cfg), []).resolved(), sort_keys=False))
        (root / "status.json").write_text('{"trials": {}}')
    with (root / ".sweep.lock").open("a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        before = tree(root)
        assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp_path / "out"), "seeds=[0, 1, 2]"]) == 2
        assert "another sweep process is running" in one_error_line(capsys)
        assert tree(root) == before


# ----------------------------------------------------------------------------- summary.json
def finished_run(run_dir: Path, summary: str, env: str = "dmc:cartpole-balance", seed: int = 0) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"env": env, "seed": seed, "num_seeds": 1}))
    (run_dir / "summary.json").write_text(summary)
    return run_dir


@pytest.mark.parametrize("summary", ["{garbage", "[]", "null", json.dumps({"env": "dmc:cheetah-run", "seeds": [0]}),
                                     json.dumps({"env": "dmc:cartpole-balance", "seeds": [1]})])
def test_a_garbage_or_foreign_summary_is_not_a_finished_trial(tmp_path, summary):
    assert trial_state(finished_run(tmp_path / "r", summary)) == "fresh"


def test_a_summary_of_the_trials_config_is_a_finished_trial(tmp_path):
    run = finished_run(tmp_path / "r", json.dumps({"env": "dmc:cartpole-balance", "seeds": [0], "steps": 100}))
    assert trial_state(run) == "done"


# ----------------------------------------------------------------------------- status.json
@pytest.mark.parametrize("text", ['{"trials": {"sac/s0": {"status": "fa', "[]", '{"trials": []}',
                                  '{"trials": {"sac/s0": "done"}}', '{"trials": {"sac/s0": 3}}'])
def test_a_damaged_status_is_rebuilt_from_the_trial_dirs(tmp_path, capsys, text):
    cfg = write_sweep(tmp_path / "tiny.yaml")
    s = spec.load_sweep(str(cfg), [])
    root = tmp_path / "tiny"
    finished_run(root / "sac" / "s0", json.dumps({"env": "dmc:cartpole-balance", "seeds": [0]}))
    (root / "status.json").write_text(text)
    status = Status(s, root, read_status(root))
    assert {t: e["status"] for t, e in status.trials.items()} == {"sac/s0": "done", "sac/s1": "pending"}
    err = capsys.readouterr().err
    assert "status.json is damaged" in err and "rebuilt" in err


# ----------------------------------------------------------------------------- envs
@pytest.mark.parametrize("env,cls", [
    ("Reacher-v2", "ImportError"), ("dm_control/compatibility-env-v0", "TypeError"),
    pytest.param("phys2d/Pendulum-v0", "ModuleNotFoundError", marks=pytest.mark.skipif(
        importlib.util.find_spec("jax") is not None, reason="gymnasium's phys2d envs build where jax is installed")),
])
def test_dry_run_of_an_env_gymnasium_cannot_build_is_one_line(tmp_path, capsys, env, cls):
    cfg = write_sweep(tmp_path / "e.yaml", {**TINY, "grid": {"env": [env]}})
    assert run_cli(sweep.main, ["--config", str(cfg), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    line = one_error_line(capsys)
    # make_env reports the id and the cause (UnknownEnvError); the dry run names it in one line
    assert line.startswith(f"error: env: '{env}' cannot be built here (") and "cannot be built" in line
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- --address
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sweep_cli(tmp_path: Path, address: str, code: str = "") -> subprocess.Popen:
    """``python -m sac_spectral.sweep`` (after ``code``, if any) on a tiny sweep with ``--address``."""
    cfg = write_sweep(tmp_path / "tiny.yaml")
    argv = ["--config", str(cfg), "--out", str(tmp_path / "out"), "--address", address, "--no-progress"]
    main = ["-m", "sac_spectral.sweep"] if not code else ["-c",
                                                          f"{code}; import sys; from sac_spectral.runs.cli import "
                                                          "run_cli; "
                                                                "sys.exit(run_cli(sweep.main, sys.argv[1:]))"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    # a shell may have left SIGINT ignored (a background job); Ctrl-C must reach the sweep as in a terminal
    return subprocess.Popen([sys.executable, *main, *argv], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def one_line_exit(proc: subprocess.Popen, timeout: float, ray_warnings: bool = False) -> tuple[int, str]:
    """The exit code and the one ``error:`` line of ``proc``, the last and, unless ``ray_warnings`` (Ray's
    C++ core logs its retries while it connects), the only line on stderr; ``proc`` is killed on a timeout."""
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
        proc.wait()
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:] and (ray_warnings or len(lines) == 1), err[-2000:]
    return proc.returncode, lines[-1]


@pytest.mark.parametrize("address,says", [
    ("127.0.0.1:{port}", "nothing accepts a connection at the Ray address 127.0.0.1:{port} ("),
    ("ray://127.0.0.1:{port}", "nothing accepts a connection at the Ray address ray://127.0.0.1:{port} ("),
    ("nosuchhost.invalid:6379", "cannot resolve the host of the Ray address nosuchhost.invalid:6379 ("),
    ("nosuchhost.invalid", "is not auto, HOST:PORT or ray://HOST:PORT"),
    ("127.0.0.1:99999", "is not auto, HOST:PORT or ray://HOST:PORT"),
])
def test_an_address_where_no_cluster_can_answer_is_one_line_within_seconds(tmp_path, address, says):
    port = free_port()
    start = time.monotonic()
    code, line = one_line_exit(sweep_cli(tmp_path, address.format(port=port)), timeout=60)
    assert code == 2 and says.format(port=port) in line, line
    assert time.monotonic() - start < 30, "refused only after Ray's own retries"
    assert not (tmp_path / "out").exists()


@pytest.fixture
def silent_port() -> Iterator[tuple[int, list[socket.socket]]]:
    """A port that accepts connections and never answers (another service, not a Ray GCS), on every
    interface: Ray dials the node's IP for 127.0.0.1. Yields the port and the connections so far."""
    server = socket.create_server(("", 0))
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    for conn in [*accepted, server]:
        conn.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_while_ray_connects_ends_the_sweep_at_once(tmp_path, silent_port, sig):
    pytest.importorskip("ray")
    port, accepted = silent_port
    proc = sweep_cli(tmp_path, f"127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    while len(accepted) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)  # the sweep's own check connects first, then Ray's
    connecting = len(accepted) >= 2
    proc.send_signal(sig)
    code, line = one_line_exit(proc, timeout=10, ray_warnings=True)
    assert connecting
    assert code == 128 + sig and f"interrupted while connecting to the Ray cluster at 127.0.0.1:{port}" in line


def test_a_port_where_no_ray_cluster_answers_is_refused_after_a_timeout(tmp_path, silent_port):
    pytest.importorskip("ray")
    port, _ = silent_port
    proc = sweep_cli(tmp_path, f"127.0.0.1:{port}",
                     "from sac_spectral.studies import sweep; sweep.CONNECT_TIMEOUT_S = 3")
    code, line = one_line_exit(proc, timeout=60, ray_warnings=True)
    assert code == 2 and f"no Ray cluster answered at 127.0.0.1:{port} within 3 s" in line, line
