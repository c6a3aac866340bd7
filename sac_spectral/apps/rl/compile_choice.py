"""Whether a run compiles its update: ``compile: true`` and ``false`` as given, ``compile: auto`` (the
default) decided here from the machine and the run's length, and the run's config then holds the
choice (``true`` or ``false``), so ``--resume`` keeps it unless ``compile`` is given again.

``auto`` compiles where all of these hold, and otherwise runs eager:

- the agent has a compiled update and the run is on the CPU (on a GPU, ``compile=true`` compiles
  into CUDA graphs; its cost there has not been measured);
- the run does at least :data:`AUTO_MIN_UPDATES` updates: the first compile on a machine, with the
  build of the C++ kernels, costs about :data:`FIRST_COMPILE_S` seconds on a busy 2-core CPU and
  each compiled update saves about :data:`UPDATE_GAIN_S` (``python -m benchmarks.compile_cost``).
  A compile from inductor's on-disk cache takes about :data:`CACHED_COMPILE_S`, so where an earlier
  run on this machine finished with the same programs (:func:`program_key`: the same agent, networks,
  regularizers, shapes, seeds, threads and torch), :data:`CACHED_MIN_UPDATES` updates repay it;
- a C++ compiler runs (inductor's lookup: ``$CXX``, else ``g++``) and the package's C++ kernels
  (:mod:`sac_spectral.core.native`) load or build.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch

from sac_spectral.agents import agent_class
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core import native
from sac_spectral.core.config import to_dict

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
#: the fewest updates for which ``compile: auto`` compiles programs that an earlier run left in the cache
CACHED_MIN_UPDATES = int(round(CACHED_COMPILE_S / UPDATE_GAIN_S, -2))
#: run options that do not shape the compiled update (left out of :func:`program_key`; any other option,
#: including one added later, is in it, so a key errs towards a cold compile)
RUN_ONLY = ("seed", "env", "total_steps", "random_steps", "buffer_size", "action_repeat", "eval_every", "eval_episodes",
            "video_every", "log_every", "checkpoint_every", "run_dir", "progress", "compile", "tasks",
            "steps_per_task", "cycles", "on_switch", "resets", "priming", "diagnostics")


def program_key(cfg: TrainConfig, obs_dim: int, act_dim: int) -> str:
    """What a run's compiled programs are specialised to: its options but :data:`RUN_ONLY`, its
    observation and action sizes and the torch version, hashed."""
    spec = {k: v for k, v in to_dict(cfg).items() if k not in RUN_ONLY}
    spec.update(obs_dim=obs_dim, act_dim=act_dim, torch=torch.__version__)
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _marker(key: str) -> Path:
    """The file that says a run with :func:`program_key` ``key`` finished compiled, beside inductor's
    cache (``$TORCHINDUCTOR_CACHE_DIR``), so clearing that cache forgets it too."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "sac_spectral_programs" / key


def remember_compiled(key: str) -> None:
    """Record that a run with these programs finished compiled: inductor's cache now holds them."""
    path = _marker(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def compiled_before(key: str) -> bool:
    """Whether a run with these programs finished compiled on this machine (see :func:`remember_compiled`)."""
    return _marker(key).exists()


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
                 kernels: Callable[[], str | None] = native.load, cached: bool = False) -> tuple[bool, str]:
    """``compile: auto``'s choice for a run of ``cfg`` on ``device`` and why, in a few words;
    ``compiler`` and ``kernels`` say why a compiler or the C++ kernels are unavailable (None: they are there),
    ``cached`` whether an earlier run left this run's programs in the cache (:func:`compiled_before`)."""
    updates = cfg.total_updates
    if not agent_class(cfg.agent).compiles:
        return False, f"agent '{cfg.agent}' has no compiled update"
    if device.type != "cpu":
        return False, f"auto compiles on the CPU only; compile=true compiles on {device.type}"
    least, compile_ = (CACHED_MIN_UPDATES, "a compile from the cache") if cached else (AUTO_MIN_UPDATES,
                                                                                     "a first compile")
    if updates < least:
        return False, (f"{updates} updates are fewer than the {least} after which {compile_} "
                       "has paid for itself; compile=true compiles anyway")
    missing = compiler()
    if missing is not None:
        return False, f"no C++ compiler ({missing})"
    unavailable = kernels()
    if unavailable is not None:
        return False, f"the C++ kernels are unavailable ({unavailable})"
    return True, (f"{updates} updates: {compile_} pays for itself after {least}; "
                  "a C++ compiler and the C++ kernels are here")


def resolve_compile(cfg: TrainConfig, device: torch.device, key: str | None = None) -> tuple[str | None, str | None]:
    """Set ``cfg.compile`` to what this run does: ``auto`` decided by :func:`auto_compile` (``key``: the
    run's :func:`program_key`, None for unknown), and ``true`` on a CPU without a C++ compiler turned to
    false. Returns the line that tells an ``auto`` choice (else None) and the warning of a fallback (else None)."""
    if cfg.compile == "auto":
        cfg.compile, why = auto_compile(cfg, device, cached=key is not None and compiled_before(key))
        return f"compile: auto → {'compiled' if cfg.compile else 'eager'} ({why})", None
    missing = missing_compiler() if cfg.compile and device.type == "cpu" else None
    if missing is None:
        return None, None
    cfg.compile = False
    return None, f"compile=true needs a C++ compiler (none found: {missing}); running eager"
