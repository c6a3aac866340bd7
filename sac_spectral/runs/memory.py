"""How much memory a run will allocate, checked against what the machine has before anything is built.

The estimates count the big allocations — replay buffer, parameters (of the networks as built,
on PyTorch's meta device) with their gradients and Adam moments, a batch's activations (forward
and backward), datasets — and ignore the small ones, so they are lower bounds that err on the side of letting a run start. The available memory
is the kernel's ``MemAvailable`` (``/proc/meminfo``), capped by a cgroup v2 limit when the process
runs in one; on a CUDA device it is the device's free memory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sac_spectral.agents.sac import make_actor, make_critic
from sac_spectral.core.config import ConfigError

FLOAT32 = 4
#: tensors per trainable parameter while training with Adam: the value, its gradient, two moments
ADAM_COPIES = 4
#: regularizers that keep copies of the parameters (θ₀, or θ₀ sorted with its order)
PARAMETER_COPIES = {"l2_init": 1, "wasserstein_init": 2}


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
    shown = ", ".join(f"{name} {format_bytes(size)}" for name, size in sorted(parts.items(), key=lambda kv: -kv[1]) if size)
    raise ConfigError(
        f"not enough memory: this config needs at least {format_bytes(total)} ({shown}) but "
        f"{format_bytes(available)} is available on {torch.device(device)}; reduce {hint}"
    )


def parameter_count(build: Callable[[], nn.Module]) -> int:
    """Parameters of the module ``build()`` returns, built on PyTorch's meta device (nothing is
    allocated, no random number is drawn)."""
    with torch.random.fork_rng(), torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


def _copies(regularizers: Sequence[Mapping[str, Any]]) -> int:
    return sum(PARAMETER_COPIES.get(str(r.get("name")), 0) for r in regularizers)


def sac_estimate(cfg: Any, obs_dim: int, act_dim: int) -> dict[str, float]:
    """Bytes of an RL run of :class:`~sac_spectral.train.TrainConfig` ``cfg``: replay buffer,
    networks (actor, critic ensemble and its target, with gradients and Adam moments, counted on
    the networks the agent builds), the transitions of one step's updates and a batch's
    activations, and the diagnostics' probe."""
    n, c, b = cfg.num_seeds, cfg.critic.num_critics, cfg.batch_size
    transition = 2 * obs_dim + act_dim + 2
    actor_sizes = [obs_dim, *cfg.actor.hidden, 2 * act_dim]
    critic_sizes = [obs_dim + act_dim, *cfg.critic.hidden, 1]
    actor = parameter_count(lambda: make_actor(n, obs_dim, act_dim, cfg.actor))
    critic = parameter_count(lambda: make_critic(n * c, obs_dim, act_dim, cfg.critic))
    networks = (
        actor * (ADAM_COPIES + _copies(cfg.actor.regularizers))
        + critic * (ADAM_COPIES + 1 + _copies(cfg.critic.regularizers))
    )
    # every hidden unit keeps its pre- and post-activation for backward, and gets a gradient of each
    critic_act = n * c * b * (critic_sizes[0] + 4 * sum(critic_sizes[1:]))
    actor_act = 2 * n * b * (actor_sizes[0] + 4 * sum(actor_sizes[1:]))
    parts = {
        "replay buffer": FLOAT32 * n * cfg.buffer_size * transition,
        "networks and Adam state": FLOAT32 * networks,
        "a batch's transitions and activations": FLOAT32 * (
            math.ceil(cfg.replay_ratio) * n * b * transition + 2 * critic_act + actor_act
        ),
    }
    if cfg.diagnostics.every:  # per-example gradients of a probe drawn from the buffer
        per_member = max(critic // (n * c), actor // n)
        parts["diagnostics probe"] = FLOAT32 * n * c * min(cfg.diagnostics.batch_size, cfg.buffer_size) * per_member
    return parts


def model_size(build: Callable[[], nn.Module], input_shape: Sequence[int]) -> tuple[int, int]:
    """``(parameters, activations per example)`` of the module ``build()`` returns, measured on
    PyTorch's meta device (nothing is allocated, no random number is drawn): every leaf module's
    output counts."""
    with torch.random.fork_rng(), torch.device("meta"):
        model = build()
        count = 0

        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            nonlocal count
            if isinstance(output, torch.Tensor):
                count += output[0].numel()

        handles = [m.register_forward_hook(hook) for m in model.modules() if not any(m.children())]
        model.eval()  # batch statistics of one example are undefined in training mode
        try:
            model(torch.empty(1, *input_shape))
        except Exception:  # noqa: BLE001 - an op without a meta kernel: count the parameters only
            count = 0
        finally:
            for h in handles:
                h.remove()
    return sum(p.numel() for p in model.parameters()), count


def supervised_estimate(
    params: int, activations: int, input_numel: int, batch_sizes: Sequence[int], itemsize: int,
    regularizers: Sequence[Mapping[str, Any]] = (),
) -> dict[str, float]:
    """Bytes of a supervised model with ``params`` parameters and ``activations`` values per example
    trained with Adam on batches of ``max(batch_sizes)`` inputs of ``input_numel`` values."""
    batch = max(batch_sizes)
    return {
        "model and Adam state": itemsize * params * (ADAM_COPIES + _copies(regularizers)),
        "a batch's inputs and activations": itemsize * batch * (input_numel + 2 * activations),
    }
