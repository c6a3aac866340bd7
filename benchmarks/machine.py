"""The machine line the benchmarks print with their figures (no torch import: the JAX workers and
``vs_jax``'s parent use it too)."""

from __future__ import annotations

import os
import platform

#: the instruction-set extensions that decide which kernels the CPU libraries pick
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def cpu_flags() -> str:
    """Which of :data:`FLAGS` this CPU has (Linux; empty elsewhere)."""
    flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0] if platform.system() == "Linux" else ""
    return " ".join(f for f in FLAGS if f" {f}" in flags)


def cpu_model() -> str:
    """The CPU's model name (Linux), or what :mod:`platform` knows."""
    if platform.system() == "Linux":
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_line() -> str:
    """``cpu: MODEL; flags: …; cores: N``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"cpu: {cpu_model()}; flags: {cpu_flags()}; cores: {cores}"
