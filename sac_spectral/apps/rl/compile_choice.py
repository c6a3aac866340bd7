"""Whether a run compiles its update: ``compile: true`` and ``false`` as given, ``compile: auto`` (the
default) decided here from the machine and the run's length, and the run's config then holds the
choice (``true`` or ``false``), so ``--resume`` keeps it unless ``compile`` is given again.

``auto`` compiles where all of these hold, and otherwise runs eager:

- the agent has a compiled update and the run is on the CPU (on a GPU, ``compile=true`` compiles
  into CUDA graphs; its cost there has not been measured);
- the run does at least :data:`AUTO_MIN_UPDATES` updates: the first compile on a machine, with the
  build of the C++ kernels, costs about :data:`FIRST_COMPILE_S` seconds on a busy 2-core CPU and
  each compiled update saves about :data:`UPDATE_GAIN_S` (``python -m benchmarks.compile_cost``;
  a compile from inductor's on-disk cache takes about :data:`CACHED_COMPILE_S`);
- a C++ compiler runs (inductor's lookup: ``$CXX``, else ``g++``) and the package's C++ kernels
  (:mod:`sac_spectral.core.native`) load or build.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import torch

from sac_spectral.agents import agent_class
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core import native

#: wall seconds of a first compile of the default agent's update (one seed, one thread), the C++ kernels'
#: build included, of a compile from inductor's cache, and saved by each compiled update; measured with
#: ``python -m benchmarks.compile_cost`` on a 2-core x86 CPU that other processes kept at a load of 6–7
#: (the first compile took 143 and 225 s, the cached one 10–28 s, the gain 10–43 ms of a 34–100 ms update)
FIRST_COMPILE_S = 225.0
CACHED_COMPILE_S = 12.0
UPDATE_GAIN_S = 0.011
#: the fewest updates for which ``compile: auto`` compiles: a first compile has paid for itself after these
#: (on an idle machine too: a first compile of 1–2 min for the kernels and 15–60 s for the update, against
#: 4.5 ms saved per update, gives about as many)
AUTO_MIN_UPDATES = int(round(FIRST_COMPILE_S / UPDATE_GAIN_S, -3))


def missing_compiler() -> str | None:
    """Why ``torch.compile`` cannot build its C++ kernels on the CPU — inductor's own lookup
    (``$CXX``, else ``g++``) finds no compiler that runs — or None if it can."""
    # a second to import: only where a compile is wanted
    from torch._inductor import config, cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except (RuntimeError, OSError, subprocess.SubprocessError):
        tried = ", ".join(repr(c) for c in config.cpp.cxx if c is not None)
        return f"tried {tried}; set CXX to one"
    return None


def auto_compile(cfg: TrainConfig, device: torch.device, compiler: Callable[[], str | None] = missing_compiler,
                 kernels: Callable[[], str | None] = native.load) -> tuple[bool, str]:
    """``compile: auto``'s choice for a run of ``cfg`` on ``device`` and why, in a few words;
    ``compiler`` and ``kernels`` say why a compiler or the C++ kernels are unavailable (None: they are there)."""
    updates = cfg.total_updates
    if not agent_class(cfg.agent).compiles:
        return False, f"agent '{cfg.agent}' has no compiled update"
    if device.type != "cpu":
        return False, f"auto compiles on the CPU only; compile=true compiles on {device.type}"
    if updates < AUTO_MIN_UPDATES:
        return False, (f"{updates} updates are fewer than the {AUTO_MIN_UPDATES} after which a first compile "
                       "has paid for itself; compile=true compiles anyway")
    missing = compiler()
    if missing is not None:
        return False, f"no C++ compiler ({missing})"
    unavailable = kernels()
    if unavailable is not None:
        return False, f"the C++ kernels are unavailable ({unavailable})"
    return True, (f"{updates} updates: a first compile pays for itself after {AUTO_MIN_UPDATES}; "
                  "a C++ compiler and the C++ kernels are here")


def resolve_compile(cfg: TrainConfig, device: torch.device) -> tuple[str | None, str | None]:
    """Set ``cfg.compile`` to what this run does: ``auto`` decided by :func:`auto_compile`, and
    ``true`` on a CPU without a C++ compiler turned to false. Returns the line that tells an
    ``auto`` choice (else None) and the warning of a fallback (else None)."""
    if cfg.compile == "auto":
        cfg.compile, why = auto_compile(cfg, device)
        return f"compile: auto → {'compiled' if cfg.compile else 'eager'} ({why})", None
    missing = missing_compiler() if cfg.compile and device.type == "cpu" else None
    if missing is None:
        return None, None
    cfg.compile = False
    return None, f"compile=true needs a C++ compiler (none found: {missing}); running eager"
