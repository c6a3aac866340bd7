"""Reward scaling by the running scale of the discounted return, as SimbaV2 does it (Lee et al.,
"Hyperspherical Normalization for Scalable Deep Reinforcement Learning", ICML 2025).

Per seed, every env step folds the reward ``r_t`` and the episode's end ``d_t`` (terminated or
truncated) into a running discounted return, its running variance and its running largest
magnitude::

    G_t = γ(1 − d_t) G_{t−1} + r_t            (G_0 = 0)
    σ²_t = the variance of G_1 … G_t          (exact, Welford's update)
    G^max_t = max(|G_1|, …, |G_t|)

(``d_t`` of the step itself, as the paper and gymnasium's ``NormalizeReward`` write it: an
episode's last reward starts the next episode's sum);
the rewards of every replay batch are divided by
``max(√(σ²_t + ε), G^max_t / G_max)`` (ε = 1e-8), with the statistics as they are when the batch
is drawn: the scaled returns keep about unit variance and, with the second term, stay within
``±G_max`` (the paper's ``G_max`` variant, 5 by default: the support ``[−5, 5]`` of its
categorical critic). The buffer stores the rewards as the env gave them, so episode and
evaluation returns stay unscaled; the statistics are part of the buffer's state, checkpointed and
resumed with it.

In a continual run a task switch cuts the episodes under way, untold to the envs' flags: ``G``
restarts there (:meth:`RewardScale.end_episodes`), so no return sums two tasks' rewards. The
variance and ``G^max`` describe the returns of the data the buffer hands out, which they divide:
with ``on_switch.buffer: keep`` that data holds the earlier tasks' transitions, so they go on (a
restart would size the divisor from a few new returns and push the kept ones beyond ``±G_max``);
a buffer cleared at a switch restarts them with it (:meth:`RewardScale.restart`), as at the start
of a run. A reset of the networks leaves the data, and so the statistics, as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

#: ``reward_scale`` choices: ``none``, or ``simbav2`` (:class:`RewardScale`)
REWARD_SCALES = ("none", "simbav2")
#: the variance's additive floor under the square root
EPS = 1e-8


class RewardScale:
    """The running statistics of ``num_seeds`` seeds' discounted returns (float64) and the divisor
    they give each seed's rewards (see the module docstring)."""

    def __init__(self, num_seeds: int, gamma: float, g_max: float = 5.0) -> None:
        if g_max <= 0:
            raise ValueError(f"g_max must be > 0, got {g_max}")
        self.gamma, self.g_max = gamma, g_max
        zeros = lambda: torch.zeros(num_seeds, dtype=torch.float64)  # noqa: E731
        self.state: dict[str, Tensor] = {"G": zeros(), "mean": zeros(), "m2": zeros(),
                                         "count": torch.zeros((), dtype=torch.float64), "g_abs_max": zeros()}

    def observe(self, reward: Any, ended: Any) -> None:
        """Fold one env step's rewards ``[N]`` and episode ends ``[N]`` (terminated or truncated)."""
        s = self.state
        r = torch.as_tensor(reward, dtype=torch.float64).reshape(-1)
        d = torch.as_tensor(ended, dtype=torch.float64).reshape(-1)
        g = self.gamma * (1.0 - d) * s["G"] + r
        count = s["count"] + 1
        delta = g - s["mean"]
        s["mean"] += delta / count
        s["m2"] += delta * (g - s["mean"])
        s["count"], s["G"] = count, g
        s["g_abs_max"] = torch.maximum(s["g_abs_max"], g.abs())

    def end_episodes(self) -> None:
        """Every seed's episode ends here, untold (a task switch): the running return restarts at 0."""
        self.state["G"].zero_()

    def restart(self) -> None:
        """Forget every statistic (the buffer's data was cleared), as at the start of a run."""
        for value in self.state.values():
            value.zero_()

    def divisor(self) -> Tensor:
        """Each seed's ``max(√(σ² + ε), G^max / G_max)`` ``[N]`` (float64)."""
        s = self.state
        var = s["m2"] / s["count"].clamp_min(1.0)
        return torch.maximum((var + EPS).sqrt(), s["g_abs_max"] / self.g_max)

    def scale(self, reward: Tensor) -> Tensor:
        """Rewards ``[N, ...]`` divided by their seed's :meth:`divisor`, in their own dtype and device."""
        d = self.divisor().to(reward.device, reward.dtype)
        return reward / d.view(-1, *([1] * (reward.dim() - 1)))

    def state_dict(self) -> dict[str, Tensor]:
        return {k: v.clone() for k, v in self.state.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if state.keys() != self.state.keys():
            raise KeyError(f"reward scale: state keys {sorted(state)} differ from {sorted(self.state)}")
        for key, value in state.items():
            if value.shape != self.state[key].shape:
                raise ValueError(f"reward scale: '{key}' has shape {tuple(value.shape)} in the checkpoint, "
                                 f"{tuple(self.state[key].shape)} here")
            self.state[key] = value.to(torch.float64).clone()


def make_reward_scale(kind: str, num_seeds: int, gamma: float, g_max: float) -> RewardScale | None:
    """The reward scale ``kind`` (:data:`REWARD_SCALES`) of a run: ``None`` for ``none``."""
    if kind not in REWARD_SCALES:
        raise ValueError(f"unknown reward_scale '{kind}'; valid: {', '.join(REWARD_SCALES)}")
    return RewardScale(num_seeds, gamma, g_max) if kind == "simbav2" else None
