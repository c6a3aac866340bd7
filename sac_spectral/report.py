"""``python -m sac_spectral.report``: the rliable report of runs and sweeps (see :mod:`sac_spectral.studies.report`)."""

import sys

from sac_spectral.runs.cli import run_cli
from sac_spectral.studies.report import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
