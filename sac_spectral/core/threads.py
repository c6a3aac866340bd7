"""CPU threads for runs that share a machine: OpenMP waiting and the default thread count.

Two things make several default runs on one machine crawl, and both are handled here:

- **Spin-waiting.** torch's bundled GNU OpenMP (libgomp) lets an idle worker thread spin for
  ``GOMP_SPINCOUNT`` = 300 000 iterations (about 3 ms) before it sleeps, after every parallel
  region. Between two updates, while the main thread steps the env, the worker spins on the other
  core; with two such processes on two cores each process's spinning threads take the cores the
  other's threads wait for at every barrier. :func:`configure_openmp` lowers the spin to
  :data:`SPIN_COUNT` (tens of microseconds, enough to bridge the gaps between the ops of one
  update) unless ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is set. libgomp reads these variables
  once, when torch loads it, so this runs on ``import sac_spectral`` before torch is imported (in
  a process that imported torch first it changes nothing).
- **Thread count.** With ``threads=0`` a run uses the cores that other processes left idle while
  it started (:func:`choose_threads`): measured from ``/proc/stat`` between ``import sac_spectral``
  and the choice, minus this process's own CPU time, and never more than torch's count
  (``OMP_NUM_THREADS`` is honoured). Two runs started together see each other importing and take
  one thread each; a run alone takes every core it may run on. ``threads=N`` sets ``N``.
- **Load that arrives later.** A barrier of an OpenMP region waits for its slowest thread, so a
  thread that shares its core with another busy process slows every region (measured: an update
  at 2 threads beside one busy process ran about 6× slower than at 1 thread). With ``threads=0``
  a run re-chooses its count every :data:`WATCH_INTERVAL_S` seconds (:class:`ThreadWatch`): a core
  that other processes kept busy more than :data:`BUSY_CORE` of the last window is not used.
"""

from __future__ import annotations

import math
import os
import sys
import time

from sac_spectral.core.config import ConfigError

SPIN_COUNT = "10000"
_MIN_WINDOW_S = 0.1
#: seconds between two choices of a running process's thread count (threads=0)
WATCH_INTERVAL_S = 10.0
#: a core that other processes keep busy more than this share of a window is left to them
BUSY_CORE = 0.25


def configure_openmp() -> None:
    """Lower libgomp's spin-wait before torch loads it (no-op if torch is loaded or it is set)."""
    if "torch" in sys.modules or "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT


def allowed_cores() -> list[int]:
    """The CPUs this process may run on."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def check_threads(threads: int, key: str = "threads", allow_auto: bool = True) -> None:
    """Raise a one-line :class:`ConfigError` unless ``threads`` lies between 1 (0 with
    ``allow_auto``: choose) and the number of cores this process may use; ``key`` names the
    option (torch crashes with far more threads than cores)."""
    low, high = (0 if allow_auto else 1), len(allowed_cores())
    if not low <= threads <= high:
        auto = " (0: those that other processes leave idle)" if allow_auto else ""
        raise ConfigError(f"{key}: {threads} is out of range; valid: {low} to {high}, the cores this process may "
                          f"use{auto}")


def _cpu_jiffies(cpus: list[int]) -> tuple[int, int] | None:
    """``(busy, total)`` clock ticks summed over ``cpus`` since boot, or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    wanted, busy, total = {f"cpu{c}" for c in cpus}, 0, 0
    for line in lines:
        name, *fields = line.split()
        if name in wanted:
            ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return (busy, total) if total else None


class CoreSample:
    """CPU ticks of the allowed cores and this process's CPU time at one moment."""

    def __init__(self) -> None:
        self.cores = allowed_cores()
        self.jiffies = _cpu_jiffies(self.cores)
        self.own = sum(os.times()[:2])
        self.wall = time.monotonic()

    def busy_elsewhere(self) -> float | None:
        """Cores kept busy by other processes since this sample (None where unmeasurable)."""
        if self.jiffies is None:
            return None
        if time.monotonic() - self.wall < _MIN_WINDOW_S:
            time.sleep(_MIN_WINDOW_S - (time.monotonic() - self.wall))
        now = _cpu_jiffies(self.cores)
        if now is None or now[1] <= self.jiffies[1]:
            return None
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        span = (now[1] - self.jiffies[1]) / len(self.cores)  # ticks per core over the window
        others = (now[0] - self.jiffies[0]) - (sum(os.times()[:2]) - self.own) * tick
        return min(max(others / span, 0.0), float(len(self.cores)))


#: taken on ``import sac_spectral``; the window :func:`choose_threads` measures starts here
START = CoreSample()


def choose_threads(requested: int, current: int, since: CoreSample | None = None) -> tuple[int, str]:
    """Threads for torch: ``requested`` if > 0; else torch's ``current`` count (all allowed cores
    unless ``OMP_NUM_THREADS`` or the embedding program lowered it) cut to the allowed cores that
    other processes did not keep busy since ``since`` (default: import time), at least 1.
    Returns the count and why."""
    if requested > 0:
        return requested, f"threads={requested}"
    cores = len(allowed_cores())
    busy = (since or START).busy_elsewhere()
    if busy is None:
        return current, f"torch's {current}"
    return free_cores(busy, cores, current), f"{cores} allowed cores, {busy:.1f} busy with other processes"


def free_cores(busy: float, cores: int, limit: int) -> int:
    """Of ``cores``, those not taken by other processes that kept ``busy`` cores busy: a core busy
    more than :data:`BUSY_CORE` of the time is theirs. At least 1, at most ``limit``."""
    return max(1, min(limit, cores - math.ceil(max(busy - BUSY_CORE, 0.0) - 1e-9)))


class ThreadWatch:
    """The thread count of a running process with ``threads=0``: every ``interval_s`` seconds,
    :func:`free_cores` of the last window, at most ``limit`` (the count chosen at start is the first)."""

    def __init__(self, limit: int, interval_s: float = WATCH_INTERVAL_S) -> None:
        self.limit, self.interval_s = limit, interval_s
        self.sample = CoreSample()

    def due(self) -> bool:
        return time.monotonic() - self.sample.wall >= self.interval_s

    def choose(self) -> int | None:
        """The count for the window that just ended (None where unmeasurable); starts the next."""
        busy = self.sample.busy_elsewhere()
        self.sample = CoreSample()
        return None if busy is None else free_cores(busy, len(self.sample.cores), self.limit)
