"""Shared fixtures: small configs, a toy env with true terminations, CPU determinism, and helpers of
the agents' tests (named noise, reference batches, a checkpoint's tensors)."""

from __future__ import annotations

import math
import signal
import sys
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

TOY_ID = "SacSpectralToyTerminating-v0"


class ToyTerminatingEnv(gym.Env):
    """1-D walk: terminates (a true end) when |x| > 1, else truncated by a 50-step TimeLimit."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.action_space = spaces.Box(-2.0, 2.0, (1,), np.float64)
        self.x = 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-0.1, 0.1))
        return np.array([self.x, 1.0]), {}

    def step(self, action):
        self.x += 0.1 * float(np.clip(action[0], -2, 2))
        terminated = abs(self.x) > 1.0
        return np.array([self.x, 1.0]), 1.0, terminated, False, {}


if TOY_ID not in gym.registry:
    gym.register(TOY_ID, entry_point=ToyTerminatingEnv, max_episode_steps=50)


@pytest.fixture(autouse=True)
def _one_thread():
    """Small nets gain nothing from more threads, and a single thread never spin-waits against
    a subprocess the test starts."""
    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global random state, whichever worker runs it and
    whatever ran before: a test's random draws never depend on the suite's order."""
    torch.manual_seed(0)
    np.random.seed(0)
    yield


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _no_leaks():
    """A test leaves the process as it found it: the same signal handlers (Ray's SIGTERM handler
    must not outlive the test that started Ray) and no more live threads (every TensorBoard
    writer, env and pool it opened is closed)."""
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    threads = set(threading.enumerate())
    yield
    changed = [signal.Signals(s).name for s, h in handlers.items() if signal.getsignal(s) is not h]
    for s, h in handlers.items():
        signal.signal(s, h)
    deadline = time.monotonic() + 5.0
    while (new := _new_threads(threads)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not changed, f"the test left changed signal handlers: {changed}"
    assert not new, f"the test left threads running: {sorted(t.name for t in new)}"


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    # Process-wide singletons are not leaks: the threads of the Ray instance of a module fixture,
    # tqdm's one monitor thread (started by the first progress bar, e.g. torch.compile's) and the
    # workers of torch's module-level executors (torch.compile's cache-key prefetch, inductor's
    # cached compile pool), which live as long as the process.
    singletons = _torch_executor_threads()
    return [t for t in threading.enumerate()
            if t not in before and t.is_alive() and t not in singletons
            and not t.name.startswith(("ray", "tqdm_monitor"))]


def _torch_executor_threads() -> set[threading.Thread]:
    executors = []
    if (functools_ := sys.modules.get("torch.utils._functools")) is not None:
        executors.append(functools_._prefetch_executor)
    compile_ = sys.modules.get("torch._inductor.async_compile")
    if compile_ is not None and compile_.AsyncCompile.pool.cache_info().currsize:
        executors.append(compile_.AsyncCompile.pool())
    return {t for executor in executors for t in executor._threads}


SMALL = [
    "actor.hidden=[32, 32]",
    "critic.hidden=[32, 32]",
    "batch_size=32",
    "progress=false",
    "eval_episodes=1",
]


def named_noise(agent, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The named noise of ``agent``'s update (its ``draws``, in their order) from the standard normals
    of ``rows [R, N, B, A]``, seed ``n``'s read from ``rows[:, n]`` row after row as its ``sample``
    stream gives them: SAC's ``next_action`` and ``action`` are rows 0 and 1, REDQ's ``subset`` the
    first ``num_critics`` values of row 2. The names the rows do not hold are left out."""
    from sac_spectral.agents.steps import draw_shapes, split_draws

    flat, shapes, total = rows.movedim(1, 0).flatten(1), {}, 0
    for name, shape in draw_shapes(agent.draws, rows.shape[2]).items():
        if total + math.prod(shape) > flat.shape[1]:
            break
        shapes[name], total = shape, total + math.prod(shape)
    return split_draws(flat[:, :total], shapes)


def reference_batch(b: int, obs: int, act: int) -> dict:
    """One seed's ``[1, b, ·]`` transitions from torch's global generator, for the tests of an
    agent's update against a reference written from its paper (a fifth of them terminal)."""
    return {"obs": torch.randn(1, b, obs), "action": torch.rand(1, b, act) * 2 - 1, "reward": torch.randn(1, b),
            "next_obs": torch.randn(1, b, obs), "terminated": (torch.rand(1, b) < 0.2).float()}


def state_tensors(state, path: str = ""):
    """``(path, tensor)`` of every tensor in a checkpoint's nested dicts and lists, less its wall time
    and evaluations (a run stopped and resumed also evaluated where it stopped)."""
    if isinstance(state, torch.Tensor):
        yield path, state
    elif isinstance(state, dict):
        for k, v in state.items():
            if k not in ("wall_time", "evals"):
                yield from state_tensors(v, f"{path}.{k}")
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            yield from state_tensors(v, f"{path}[{i}]")


def reference_config(agent: str, actor: list[int], critic: list[int] | None = None, **kw):
    """``agent``'s run config for a test of its update against a reference written from its paper:
    hidden widths ``actor`` for the actor and ``critic`` (default: the same) for the critics, no
    regularizers; ``kw`` sets top-level keys."""
    from sac_spectral.apps.rl.config import TrainConfig

    cfg = TrainConfig(agent=agent, **kw)
    cfg.actor.hidden, cfg.critic.hidden = list(actor), list(actor if critic is None else critic)
    cfg.actor.regularizers, cfg.critic.regularizers = [], []
    return cfg


def reference_policy(actor: list, obs: torch.Tensor, noise: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """SAC's policy for one seed from its equations: a ReLU trunk of ``(W, b)`` pairs ``actor[:-2]``,
    mean and raw log σ heads ``actor[-2:]``, log σ squashed into ``[log_std_min, log_std_max]`` of the
    actor config ``cfg``; the action ``tanh(μ + σ·noise)`` and its log-density from ``torch.distributions``."""
    from torch.distributions import Normal, TanhTransform, TransformedDistribution

    h = obs
    for w, b in actor[:-2]:
        h = torch.relu(h @ w.T + b)
    mean = h @ actor[-2][0].T + actor[-2][1]
    raw = h @ actor[-1][0].T + actor[-1][1]
    lo, hi = cfg.log_std_min, cfg.log_std_max
    std = (lo + 0.5 * (hi - lo) * (torch.tanh(raw) + 1)).exp()
    tanh = TanhTransform(cache_size=1)
    action = tanh(mean + std * noise)
    return action, TransformedDistribution(Normal(mean, std), [tanh]).log_prob(action).sum(-1)


@pytest.fixture
def bf16_configs(monkeypatch):
    """``precision=bf16`` run configs validate on any CPU: without native bf16 matmuls torch emulates
    them (slower, the same rounding), and the refusal a user gets there is tested on its own."""
    from sac_spectral.apps.rl import config as run_config

    monkeypatch.setattr(run_config, "cpu_bf16", lambda: True)


@pytest.fixture
def float64():
    """Tensors in float64 for the test (the default dtype restored after it)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
