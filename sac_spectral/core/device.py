"""The ``device`` option of every runner."""

from __future__ import annotations

import torch

from sac_spectral.core.config import check


def check_device(device: str) -> None:
    """The ``device`` key of every runner: ``cpu``, or ``cuda[:i]`` where CUDA is available."""
    check(
        device == "cpu" or (device.startswith("cuda") and torch.cuda.is_available()),
        "device",
        f"'{device}' is not available here; valid: cpu" + (", cuda" if torch.cuda.is_available() else ""),
    )
