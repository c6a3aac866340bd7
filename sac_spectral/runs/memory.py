"""How much memory a run will allocate, checked against what the machine has before anything is built.

The estimates count the big allocations — replay buffer, parameters (of the networks as built,
on PyTorch's meta device) with their gradients and Adam moments, a batch's activations (forward
and backward), datasets — and ignore the small ones, so they are lower bounds that err on the side of letting a run
start. The available memory is the kernel's ``MemAvailable`` (``/proc/meminfo``), capped by a cgroup v2 limit when the
process runs in one; on a CUDA device it is the device's free memory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from sac_spectral.core.config import ConfigError
from sac_spectral.core.sizes import ADAM_COPIES
from sac_spectral.regularizers import parameter_copies


def format_bytes(n: float) -> str:
    """``1.5 GiB``; beyond PiB in powers of ten (``3.2e+290 PiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB" if abs(n) < 1e4 else f"{n:.2g} PiB"


def _meminfo_available(path: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_available(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(int(limit) - int((root / "memory.current").read_text().strip()), 0)
    except (OSError, ValueError):
        return None


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """Memory a new allocation can get on ``device`` now (``None`` if it cannot be told)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    known = [n for n in (_meminfo_available(), _cgroup_available()) if n is not None]
    if not known:
        try:
            known = [os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
        except (ValueError, OSError):
            return None
    return min(known)


def check_fits(parts: Mapping[str, float], device: torch.device | str, hint: str) -> None:
    """Raise a one-line :class:`ConfigError` if the estimated ``parts`` (name → bytes) exceed the
    memory available on ``device``; ``hint`` names the keys that shrink them."""
    total = sum(parts.values())
    available = available_bytes(device)
    if available is None or total <= available:
        return
    shown = ", ".join(f"{name} {format_bytes(size)}" for name,
                      size in sorted(parts.items(), key=lambda kv: -kv[1]) if size)
    raise ConfigError(
        f"not enough memory: this config needs at least {format_bytes(total)} ({shown}) but "
        f"{format_bytes(available)} is available on {torch.device(device)}; reduce {hint}"
    )


def supervised_estimate(
    params: int, activations: int, input_numel: int, batch_sizes: Sequence[int], itemsize: int,
    regularizers: Sequence[Mapping[str, Any]] = (),
) -> dict[str, float]:
    """Bytes of a supervised model with ``params`` parameters and ``activations`` values per example
    trained with Adam on batches of ``max(batch_sizes)`` inputs of ``input_numel`` values."""
    batch = max(batch_sizes)
    return {
        "model and Adam state": itemsize * params * (ADAM_COPIES + parameter_copies(regularizers)),
        "a batch's inputs and activations": itemsize * batch * (input_numel + 2 * activations),
    }
