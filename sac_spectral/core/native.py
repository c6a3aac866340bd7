"""The package's C++ CPU kernels, built once per machine and loaded: ``onednn.cpp`` (the member-batched
products of :mod:`sac_spectral.core.onednn`) and ``adam.cpp`` (the Adam step of
:mod:`sac_spectral.core.optim`). Their operators' schemas are defined in those modules; the library
registers their CPU implementations. Compiled CPU updates call both from inductor's C++ wrapper."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

SOURCES = tuple(Path(__file__).with_name(name) for name in ("onednn.cpp", "adam.cpp"))


@functools.cache
def load() -> str | None:
    """Build (torch caches the build, about 15 s the first time on a machine) and load the kernels
    with torch's C++ extension builder (the C++ compiler a compiled update needs anyway):
    ``None``, or why they are unavailable here."""
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    from torch.utils import cpp_extension

    from sac_spectral.core import onednn, optim  # noqa: F401  (the schemas the kernels implement)

    try:
        cpp_extension.load("sac_spectral_native", [str(s) for s in SOURCES], extra_cflags=["-O2"], is_python_module=False)
    except Exception as error:  # a missing compiler or ninja, or a torch without the entry point
        text = str(error).strip()
        return f"building {', '.join(s.name for s in SOURCES)} failed: {text.splitlines()[-1] if text else type(error).__name__}"
    return None
