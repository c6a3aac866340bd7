"""``python -m sac_spectral.continual``: the continual supervised runner (see
:mod:`sac_spectral.apps.continual.runner`)."""

import sys

from sac_spectral.apps.continual.runner import main
from sac_spectral.runs.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
