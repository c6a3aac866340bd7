"""A sweep on a running two-node Ray cluster (``--address``), both nodes on this machine, with Ray's
token authentication as ``ray start --head`` turns it on where ``~/.ray/auth_token`` exists (Ray
>= 2.59): every command gets RAY_AUTH_MODE=token, as the docs say. The trials' entries in
``status.json`` name the Ray node each ran on. The docs' way to stop a node ends that node and no other."""

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
SWEEP = {
    "kind": "train",
    "base": {"env": "dmc:cartpole-balance", "total_steps": 300, "random_steps": 100, "eval_every": 0,
             "eval_episodes": 1, "batch_size": 16, "actor.hidden": [16], "critic.hidden": [16],
             "checkpoint_every": 100, "diagnostics.every": 0},
    "methods": {"sac": {}},
    "seeds": [0, 1],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_status(env: dict, address: str) -> str:
    return subprocess.run([RAY, "status", "--address", address], env=env, capture_output=True, text=True,
                          timeout=60, check=False).stdout


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A head and a worker node, 1 CPU each, their own temp dirs, a token file in a private HOME;
    each ``ray start --block`` is stopped by its pid (it stops its node's processes)."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    # Ray's socket paths lie under its temp dir and must stay under 108 bytes (AF_UNIX): a short one
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp" if os.path.isdir("/tmp") else None))
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "token", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    address = f"127.0.0.1:{free_port()}"
    common = ["--num-cpus", "1", "--disable-usage-stats", "--block"]
    def start(name: str, *args: str) -> subprocess.Popen:
        """``ray start`` of one node, with its own temp dir and agent port, its output in a log file."""
        with (tmp_path / f"{name}.log").open("w") as log:
            return subprocess.Popen([RAY, "start", *args, "--temp-dir", str(ray_tmp / name),
                                     f"--dashboard-agent-listen-port={free_port()}", *common], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    nodes = [start("head", "--head", f"--port={address.split(':')[1]}", "--include-dashboard=false")]
    try:
        deadline = time.monotonic() + 60
        while "node_" not in ray_status(env, address):
            assert time.monotonic() < deadline and nodes[0].poll() is None, (tmp_path / "head.log").read_text()[-2000:]
            time.sleep(1)
        nodes.append(start("worker", f"--address={address}"))
        while ray_status(env, address).count(" node_") < 2:
            assert time.monotonic() < deadline and nodes[1].poll() is None, \
                (tmp_path / "worker.log").read_text()[-2000:]
            time.sleep(1)
        yield env, address
    finally:
        for proc in reversed(nodes):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def documented(prefix: str) -> str:
    """The command of the cluster recipe in docs/studies.md that starts with ``prefix``."""
    recipe = (ROOT / "docs" / "studies.md").read_text().split("## On a cluster", 1)[1].split("```bash\n", 1)[1]
    return next(line for line in recipe.split("```",
                                              1)[0].splitlines() if line.startswith(prefix)).split("#")[0].strip()


def processes() -> dict[int, int]:
    """The parent of every process now, by pid (from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return parents


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it now."""
    parents, found, todo = processes(), set(), [pid]
    while todo:
        here = todo.pop()
        found.add(here)
        todo += [child for child, parent in parents.items() if parent == here]
    return found


def test_the_documented_stop_ends_the_node_it_started_and_no_other(tmp_path, two_nodes):
    """docs/studies.md: `ray start --head ... --block &` with its pid recorded, then `kill` of that pid,
    stops every process of that node within seconds; the other cluster on this machine keeps both nodes."""
    env, other = two_nodes
    port = free_port()
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp" if os.path.isdir("/tmp") else None))
    own = (f"--temp-dir {ray_tmp} --num-cpus 1 --include-dashboard=false --disable-usage-stats "
           f"--dashboard-agent-listen-port={free_port()} --block")
    start = documented("ray start --head").replace("ray start", f"{RAY} start", 1).replace("6379", str(port))
    subprocess.run(["bash", "-c", start.replace("--block", own)], cwd=tmp_path, env=env, check=True, timeout=60,
                   start_new_session=True)
    pid = int((tmp_path / "ray-node.pid").read_text())
    try:
        deadline = time.monotonic() + 60
        while "node_" not in ray_status(env, f"127.0.0.1:{port}"):
            assert time.monotonic() < deadline and pid in processes(), (tmp_path / "ray-node.log").read_text()[-2000:]
            time.sleep(1)
        node = descendants(pid)
        assert len(node) > 2, node  # ray start, the GCS, the raylet, ...
        subprocess.run(["bash", "-c", documented("kill ")], cwd=tmp_path, env=env, check=True, timeout=60)
        deadline = time.monotonic() + 60
        while node & processes().keys():
            assert time.monotonic() < deadline, f"still running after the documented stop: {node & processes().keys()}"
            time.sleep(1)
    finally:
        for leftover in descendants(pid) & processes().keys():
            with contextlib.suppress(ProcessLookupError):
                os.kill(leftover, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert ray_status(env, other).count(" node_") == 2


def test_two_node_cluster_runs_trials_on_both_nodes(tmp_path, two_nodes):
    env, address = two_nodes
    cfg = tmp_path / "two.yaml"
    cfg.write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    cmd = [sys.executable, "-m", "sac_spectral.sweep", "--config", str(cfg), "--out", str(tmp_path / "out"),
           "--address", address, "--no-progress"]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    trials = json.loads((tmp_path / "out" / "two" / "status.json").read_text())["trials"]
    assert {e["status"] for e in trials.values()} == {"done"}
    assert len({e["node"] for e in trials.values()}) == 2, trials


def test_two_node_cluster_refused_without_token_mode_is_one_line(tmp_path, two_nodes):
    env, address = two_nodes
    cfg = tmp_path / "two.yaml"
    cfg.write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    env = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
    cmd = [sys.executable, "-m", "sac_spectral.sweep", "--config", str(cfg), "--out", str(tmp_path / "out"),
           "--address", address, "--no-progress"]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "RAY_AUTH_MODE=token" in errors[0] and "cannot connect" in errors[0], \
        done.stderr[-1000:]
