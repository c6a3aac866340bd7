"""The C heap of a training process: keep freed memory for the next update.

An update allocates its activations, gradients and products (megabytes each with several seeds)
and frees them when it returns; the next update allocates the same sizes again. glibc's ``malloc``
by default serves a block of 128 KiB or more (a threshold it raises to the largest block freed so
far) with a fresh ``mmap`` and gives the free memory at the top of its heap back to the kernel
once it exceeds twice that threshold: the next update's blocks are then new pages, and every page
costs a page fault and the kernel's zeroing on first touch. A compiled update at ten seeds spent a
third of its time there (58.6 against 36.8 ms per update on a 2-core AMD EPYC, one thread;
``benchmarks/heap.py``).

:func:`configure_heap` fixes both thresholds with ``mallopt``: blocks below :data:`MMAP_THRESHOLD`
come from the heap, and the heap keeps up to :data:`TRIM_THRESHOLD` of free memory at its top.
A process then holds the peak of what it allocated below those sizes rather than returning it
between updates. It runs when a run starts (``runs.run.Run``: train, continual, a sweep's
trials), not on ``import sac_spectral``, so a program that only loads a policy keeps glibc's
defaults; it changes nothing where the C library is not glibc, or where the user set glibc's own
variables (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TOP_PAD_``,
``GLIBC_TUNABLES``).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

#: blocks below this size come from the heap (glibc's largest allowed threshold on 64-bit)
MMAP_THRESHOLD = 32 << 20
#: free memory the heap keeps at its top instead of returning it to the kernel
TRIM_THRESHOLD = 1 << 30
#: ``mallopt`` parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: environment variables through which a user already tuned glibc's malloc
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


@functools.cache
def configure_heap() -> bool:
    """Fix glibc's trim and mmap thresholds (once per process); whether they were set."""
    if not sys.platform.startswith("linux") or any(key in os.environ for key in USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # musl, macOS: another malloc
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
