"""The heap setting of ``import sac_spectral``: memory an update frees serves the next update
without new page faults, and glibc variables the user set are left alone."""

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
import json, resource, sys
import torch
import sac_spectral
from sac_spectral.core.heap import configure_heap
faults = []
for r in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.ones((1 << 20) + (r << 14)) for _ in range(8)]
    del blocks
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"configured": configure_heap(), "faults": faults}))
"""


def _rounds(**env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ROUNDS], env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not configure_heap(), reason="not glibc")
def test_freed_blocks_serve_the_next_round_without_page_faults():
    """With the setting, rounds after the heap has grown (three here) reuse it, faulting in only
    what they add (128 pages; a 4 MiB block is 1024); with glibc's defaults (the user's empty
    ``GLIBC_TUNABLES``: left alone) every round maps its blocks anew and faults them all in."""
    mine, default = _rounds(), _rounds(GLIBC_TUNABLES="")
    assert mine["configured"] and not default["configured"]
    assert max(mine["faults"][3:]) < 400, mine
    assert min(default["faults"][3:]) > 4000, default
