"""TensorBoard logging for a run directory, with per-seed tags for multi-seed runs.

With one seed a value is written under its tag (``eval/return``); with ``N`` seeds each seed's
value goes to ``seed<i>/<tag>`` and the mean over seeds to ``<tag>``. :class:`RunLogger` is the
one place that names per-seed tags (scalars, episode returns and histograms).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor


class RunLogger:
    """Writes scalars, histograms and hparams to TensorBoard event files in ``run_dir``."""

    def __init__(self, run_dir: Path, num_seeds: int = 1, purge_step: int | None = None) -> None:
        self.run_dir, self.num_seeds = Path(run_dir), num_seeds
        self.writer = self.writer_class()(log_dir=str(run_dir), purge_step=purge_step)
        self._last_return: list[float | None] = [None] * num_seeds

    @staticmethod
    def writer_class() -> type:
        """TensorBoard's ``SummaryWriter``, imported on first use (not on ``import sac_spectral``: a
        run loads it with its envs and agent, before it writes its directory)."""
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter

    def seed_tag(self, tag: str, seed: int) -> str:
        """``tag`` for one seed's value: the tag itself in a one-seed run, else ``seed<i>/<tag>``."""
        return tag if self.num_seeds == 1 else f"seed{seed}/{tag}"

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, float(value), step)

    def per_seed(self, tag: str, values: Tensor | Sequence[float] | float, step: int) -> None:
        """Log one value per seed (``[N]``) or one shared value (scalar)."""
        vals = values.detach().float().reshape(-1).tolist() if isinstance(values, Tensor) else values
        if isinstance(vals, (int, float)):
            self.scalar(tag, vals, step)
            return
        vals = list(vals)
        if len(vals) == 1:
            self.scalar(tag, vals[0], step)
            return
        for i, v in enumerate(vals):
            self.scalar(self.seed_tag(tag, i), v, step)
        self.scalar(tag, sum(vals) / len(vals), step)

    def scalars(self, values: Mapping[str, Tensor | float], step: int) -> None:
        for tag, value in values.items():
            self.per_seed(tag, value, step)

    def histogram(self, tag: str, values: Tensor, step: int) -> None:
        self.writer.add_histogram(tag, values.detach().float().cpu(), step)

    def histograms(self, tag: str, values: Tensor, step: int) -> None:
        """One histogram per seed of ``values: [N, ...]``."""
        for i, seed_values in enumerate(values):
            self.histogram(self.seed_tag(tag, i), seed_values, step)

    def episodes(self, finished: Sequence[tuple[int, float, int]], step: int) -> None:
        """``train/episode_return`` of the episodes that ended at ``step`` (``(seed index, return,
        length)``); with several seeds also their mean ``train/episode_return``: the mean of every
        seed's latest return, written once every seed has finished an episode."""
        for i, ret, _ in finished:
            self.scalar(self.seed_tag("train/episode_return", i), ret, step)
            self._last_return[i] = ret
        latest = self._last_return
        if finished and self.num_seeds > 1 and all(r is not None for r in latest):
            self.scalar("train/episode_return", sum(latest) / len(latest), step)  # type: ignore[arg-type]

    def video(self, tag: str, frames: Any, step: int, fps: float) -> None:
        """An episode's frames ``[T, H, W, 3]`` uint8 as an animated GIF (what ``add_video`` writes,
        without its moviepy dependency); TensorBoard shows it under IMAGES."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        from sac_spectral.runs.video import gif_bytes

        t, h, w, c = frames.shape
        image = Summary.Image(height=h, width=w, colorspace=c, encoded_image_string=gif_bytes(frames, fps))
        self.writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)

    def hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        """Hyperparameters with final metrics (TensorBoard's HPARAMS tab)."""
        clean = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in hparams.items()}
        self.writer.add_hparams(clean, {f"hparam/{k}": float(v) for k, v in metrics.items()}, run_name=".")

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()



def tensor_is_finite(values: Mapping[str, Tensor]) -> bool:
    """True if every tensor in ``values`` is finite (one host sync)."""
    flags = [torch.isfinite(v).all() for v in values.values()]
    return bool(torch.stack(flags).all()) if flags else True


def _floating_tensors(state: Any) -> list[Tensor]:
    if isinstance(state, Tensor):
        return [state] if state.is_floating_point() or state.is_complex() else []
    if isinstance(state, Mapping):
        return [t for v in state.values() for t in _floating_tensors(v)]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in _floating_tensors(v)]
    return []


def _floats(state: Any) -> list[float]:
    if isinstance(state, float):
        return [state]
    if isinstance(state, Mapping):
        return [x for v in state.values() for x in _floats(v)]
    if isinstance(state, (list, tuple)):
        return [x for v in state for x in _floats(v)]
    return []


def state_is_finite(state: Any) -> bool:
    """True if every floating-point tensor and float anywhere in a nested state (dicts, lists,
    tuples) — parameters, optimizer moments, temperatures, regularizer state — is finite
    (one host sync per device)."""
    if not all(math.isfinite(x) for x in _floats(state)):
        return False
    flags: dict[torch.device, list[Tensor]] = {}
    for t in _floating_tensors(state):
        flags.setdefault(t.device, []).append(torch.isfinite(t).all())
    return all(bool(torch.stack(group).all()) for group in flags.values())
