import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from sac_spectral.core import threads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_importing_the_package_lowers_the_openmp_spin():
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", "import sac_spectral, os; print(os.environ.get('GOMP_SPINCOUNT'))"],
                         env={**clean, "PYTHONPATH": ROOT}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == threads.SPIN_COUNT


@pytest.mark.parametrize(
    "torch_loaded, env, expected",
    [(False, {}, threads.SPIN_COUNT), (True, {}, None), (False, {"GOMP_SPINCOUNT": "7"}, "7"),
     (False, {"OMP_WAIT_POLICY": "ACTIVE"}, None)],
)
def test_the_spin_is_set_only_before_torch_loads_and_never_over_the_users_setting(monkeypatch, torch_loaded, env,
                                                                                  expected):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(threads, "sys", SimpleNamespace(modules={"torch": None} if torch_loaded else {}))
    threads.configure_openmp()
    assert os.environ.get("GOMP_SPINCOUNT") == expected


def _sample_with(monkeypatch, jiffies, own_s, cores=(0, 1)):
    monkeypatch.setattr(threads, "allowed_cores", lambda: list(cores))
    monkeypatch.setattr(threads, "_cpu_jiffies", lambda cpus: jiffies[0])
    monkeypatch.setattr(threads.os, "times", lambda: (own_s[0], 0.0, 0.0, 0.0, 0.0))
    sample = threads.CoreSample()
    monkeypatch.setattr(threads, "_cpu_jiffies", lambda cpus: jiffies[1])
    monkeypatch.setattr(threads.os, "times", lambda: (own_s[1], 0.0, 0.0, 0.0, 0.0))
    return sample


@pytest.mark.parametrize(
    "busy_ticks, own_s, expected_busy, expected_threads",
    [(10, 0.1, 0.0, 2), (160, 0.6, 1.0, 1), (200, 0.0, 2.0, 1), (120, 1.0, 0.2, 2)],
)
def test_busy_cores_are_what_other_processes_used_in_the_window(monkeypatch, busy_ticks, own_s, expected_busy,
                                                                expected_threads):
    # two cores, 100 ticks each over the window; this process used own_s seconds (100 ticks per second)
    sample = _sample_with(monkeypatch, [(1000, 5000), (1000 + busy_ticks, 5200)], (1.0, 1.0 + own_s))
    monkeypatch.setattr(threads.os, "sysconf", lambda name: 100)
    assert sample.busy_elsewhere() == pytest.approx(expected_busy)
    assert threads.choose_threads(0, 2, sample)[0] == expected_threads
    assert threads.choose_threads(0, 1, sample)[0] == 1  # never more than torch's own count
    assert threads.choose_threads(3, 2, sample)[0] == 3  # an explicit count wins


def test_without_proc_stat_torch_keeps_its_count(monkeypatch):
    sample = _sample_with(monkeypatch, [None, None], (1.0, 1.0))
    assert sample.busy_elsewhere() is None
    assert threads.choose_threads(0, 2, sample) == (2, "torch's 2")


@pytest.mark.parametrize(
    "busy_ticks, own_s, limit, expected",
    [(10, 0.1, 2, 2), (20, 0.0, 2, 2), (30, 0.0, 2, 1), (160, 0.6, 2, 1), (200, 0.0, 2, 1), (120, 1.0, 2, 2),
     (10, 0.1, 1, 1)],
)
def test_a_running_process_leaves_the_cores_others_keep_busy(monkeypatch, busy_ticks, own_s, limit, expected):
    """ThreadWatch: a core busy with other processes more than a quarter of the window is left to
    them (two cores, 100 ticks each over the window; this process used ``own_s`` seconds)."""
    monkeypatch.setattr(threads.os, "sysconf", lambda name: 100)
    watch = threads.ThreadWatch(limit, interval_s=0.0)
    watch.sample = _sample_with(monkeypatch, [(1000, 5000), (1000 + busy_ticks, 5200)], (1.0, 1.0 + own_s))
    assert watch.due()
    assert watch.choose() == expected


def test_a_running_process_keeps_its_count_where_load_is_unmeasurable(monkeypatch):
    watch = threads.ThreadWatch(2, interval_s=3600.0)
    assert not watch.due()
    watch.sample = _sample_with(monkeypatch, [None, None], (1.0, 1.0))
    assert watch.choose() is None
