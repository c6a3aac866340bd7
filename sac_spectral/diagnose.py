"""``python -m sac_spectral.diagnose``: plasticity diagnostics of a saved RL run (see
:mod:`sac_spectral.apps.rl.diagnose`)."""

import sys

from sac_spectral.apps.rl.diagnose import main
from sac_spectral.runs.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
