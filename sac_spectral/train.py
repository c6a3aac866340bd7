"""``python -m sac_spectral.train``: the RL runner (see :mod:`sac_spectral.apps.rl.train`)."""

import sys

from sac_spectral.apps.rl.train import main
from sac_spectral.runs.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
