"""sac_spectral: plasticity research toolkit — high-replay-ratio SAC, regularizers, continual streams, diagnostics."""

from sac_spectral.core.threads import configure_openmp

configure_openmp()  # before anything imports torch: libgomp reads its spin-wait setting when torch loads it

__version__ = "0.1.0"
