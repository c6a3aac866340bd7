"""``python -m sac_spectral.sweep``: run a study on Ray (see :mod:`sac_spectral.studies.sweep`)."""

import sys

from sac_spectral.runs.cli import run_cli
from sac_spectral.studies.sweep import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
