"""``python -m sac_spectral.play``: play a trained policy of an RL run (see :mod:`sac_spectral.apps.rl.play`)."""

import sys

from sac_spectral.apps.rl.play import main
from sac_spectral.runs.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
