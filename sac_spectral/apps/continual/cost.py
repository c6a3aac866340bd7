"""The dry run's cost of a continual trial (:attr:`RunKind.cost <sac_spectral.runs.kinds.RunKind>`
of ``continual``): its iterations times the measured time of one, plus every task end (train and
test evaluation, diagnostics) times the measured time of one."""

from __future__ import annotations

from typing import Any

import torch

from sac_spectral.apps.continual.runner import ContinualConfig, ContinualRunner
from sac_spectral.core.config import to_dict


def estimate_cost(cfg: ContinualConfig, model: Any) -> tuple[int, float]:
    """``(iterations, seconds)`` of a run of ``cfg``; ``model`` (a
    :class:`~sac_spectral.studies.cost.CostModel`) measures and caches the timings."""
    iterations = cfg.stream.num_tasks * cfg.stream.iters_per_task
    torch.set_num_threads(model.threads)

    def times() -> tuple[float, float]:
        runner = ContinualRunner(cfg)
        task = runner.stream.task(0)
        x, y = task.train_batch(runner.gen, cfg.batch_size, runner.dtype)
        runner.learner.train_step(x, y)
        t_iter = model.measure(lambda: [runner.learner.train_step(x, y) for _ in range(5)]) / 5
        px, py = next(task.eval_batches("train", cfg.probe_size, cfg.probe_size, runner.dtype))

        def task_end() -> None:
            for split in ("train", "test"):
                runner.learner.evaluate(task.eval_batches(split, 1024, cfg.eval_examples, runner.dtype))
            runner.learner.diagnose(px, py, 0, 0, True)

        return t_iter, model.measure(task_end, repeats=1)

    key = {k: v for k, v in to_dict(cfg).items() if k not in ("seed", "run_dir", "threads", "progress", "stream")}
    key["stream"] = {k: v for k, v in to_dict(cfg.stream).items() if k != "num_tasks"}
    t_iter, t_task_end = model.cached(["iter", key], times)
    return iterations, iterations * t_iter + cfg.stream.num_tasks * t_task_end
