"""A training run's evaluations: the deterministic policy's returns on separately seeded envs of
each task (``eval/…``, ``evals.csv``), its videos and the critics' value scale
(:mod:`~sac_spectral.apps.rl.value_scale`). None of them draws from the run's training streams."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from sac_spectral.apps.rl.kind import KIND
from sac_spectral.apps.rl.value_scale import agent_q_scale
from sac_spectral.envs.evaluate import eval_seed, evaluate
from sac_spectral.runs.evals import append_rows
from sac_spectral.runs.layout import EVALS
from sac_spectral.runs.video import frame_schedule, record_episode, video_suffix

if TYPE_CHECKING:
    from sac_spectral.apps.rl.train import Trainer


class Evaluation:
    """The evaluations of ``trainer``'s agent as it is now."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer

    def returns(self, policy: Callable[[np.ndarray], np.ndarray], step: int | str, task: int) -> np.ndarray:
        """Mean return per seed of ``policy`` on task ``task`` (the run's ``eval_envs_of``)."""
        t = self.t
        with t.simulating(t.sequence.latest(task, max(t.step - 1, 0))):
            return evaluate(policy, t.eval_envs_of(task), t.seeds, step, t.cfg.eval_episodes)

    def policy(self, obs: np.ndarray) -> np.ndarray:
        """The agent's deterministic actions for a batch of observations, one per seed."""
        return self.t.agent.act(torch.as_tensor(obs, device=self.t.device), deterministic=True).cpu().numpy()

    def run(self) -> None:
        """The current task's evaluation; at a task switch and at the end of a sequence, every task's
        (``eval/<task>/return``); ``eval/return`` is the current task's."""
        t = self.t
        stage, seq = t.stage(), t.sequence
        every_task = bool(t.cfg.tasks) and (seq.is_switch(t.step) or t.step == t.cfg.total_steps)
        rows, evals, warmup = [], [], t.warming_up(t.step)
        for i in range(len(seq.tasks)) if every_task else [stage.task]:
            name = seq.tasks[i].name
            returns = self.returns(self.policy, t.step if i == stage.task else f"{t.step}/{name}", i)
            evals.append({"step": t.step, "updates": t.agent.num_updates, "returns": returns.tolist(),
                          "task": name, "stage": stage.index, "warmup": warmup})
            rows += [{"step": t.step, "seed": s, "updates": t.agent.num_updates, "return": float(r),
                      "episodes": t.cfg.eval_episodes, "wall_time_s": t.wall_time, "task": name,
                      "stage": stage.index, "warmup": int(warmup)} for s, r in zip(t.seeds, returns)]
            if t.cfg.tasks:
                t.logger.per_seed(f"eval/{name}/return", returns.tolist(), t.step)
            if i == stage.task:
                t.logger.per_seed("eval/return", returns.tolist(), t.step)
                t.postfix["eval"] = f"{float(returns.mean()):.1f}"
        t.evals += evals
        append_rows(t.logger.run_dir / EVALS, KIND.columns, rows)

    def video(self) -> None:
        """Seed 0's first episode of the evaluation just played, as ``videos/step_<step>`` and under
        TensorBoard's ``eval/video`` (at half the frame size)."""
        t = self.t
        env, members = t.eval_envs[0], len(t.seeds)
        path = t.run_dir / "videos" / f"step_{t.step:08d}{video_suffix()}"
        path.parent.mkdir(exist_ok=True)
        frames = record_episode(lambda obs: self.policy(np.repeat(obs[None], members, axis=0))[0], env,
                                eval_seed(t.seeds[0], t.step, 0), path)
        t.logger.video("eval/video", frames[:, ::2, ::2], t.step, frame_schedule(env)[1])

    def value_scale(self, task: int, prefix: str) -> dict[str, list[float]]:
        """:func:`~sac_spectral.apps.rl.value_scale.agent_q_scale` of the agent now on task ``task``'s
        evaluation envs (``diagnostics.q_scale`` episodes per seed), logged under ``prefix``."""
        t = self.t
        with t.simulating(t.sequence.latest(task, max(t.step - 1, 0))):
            values = agent_q_scale(t.agent, t.eval_envs_of(task), t.seeds, f"q_scale/{t.step}",
                                   t.cfg.diagnostics.q_scale, t.cfg.gamma, t.buffer.reward_scale)
        for tag, per_seed in values.items():
            t.logger.per_seed(prefix + tag, per_seed, t.step)
        return values
