"""The heap setting of a run: memory an update frees serves the next update without new page
faults, glibc variables the user set are left alone, and ``import sac_spectral`` alone keeps
glibc's defaults (a program that only loads a policy gives freed memory back)."""

import json
import os
import subprocess
import sys

import pytest

from sac_spectral.core.heap import configure_heap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

#: ten rounds of what an update does: allocate 8 blocks of 4 MiB (a little more each round), write
#: them, free them all
ROUNDS = """
import json, os, resource, sys
import torch
import sac_spectral
from sac_spectral.core.heap import configure_heap
configured = configure_heap() if os.environ.get("CONFIGURE") == "1" else False
faults = []
for r in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.ones((1 << 20) + (r << 14)) for _ in range(8)]
    del blocks
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"configured": configured, "faults": faults}))
"""


def _rounds(**env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ROUNDS], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not configure_heap(), reason="not glibc")
def test_freed_blocks_serve_the_next_round_without_page_faults():
    """With the setting, rounds after the heap has grown (three here) reuse it, faulting in only
    what they add (128 pages; a 4 MiB block is 1024); with glibc's defaults (the user's empty
    ``GLIBC_TUNABLES``: left alone) every round maps its blocks anew and faults them all in."""
    mine, default = _rounds(CONFIGURE="1"), _rounds(CONFIGURE="1", GLIBC_TUNABLES="")
    assert mine["configured"] and not default["configured"]
    assert max(mine["faults"][3:]) < 400, mine
    assert min(default["faults"][3:]) > 4000, default


@pytest.mark.skipif(not configure_heap(), reason="not glibc")
def test_import_alone_keeps_glibc_defaults_and_a_run_sets_them():
    """``import sac_spectral`` (as ``load_policy`` in a service) leaves malloc as glibc has it: every
    round maps its blocks anew. Starting a run (``runs.run.Run``) sets the thresholds."""
    imported = _rounds()
    assert not imported["configured"] and min(imported["faults"][3:]) > 4000, imported
    code = ("import sac_spectral.core.heap as h, sac_spectral.runs.run as r; "
            "r.Run('x', None, None); print(h.configure_heap.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
