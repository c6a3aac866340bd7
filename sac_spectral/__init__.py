"""sac_spectral: plasticity research toolkit — high-replay-ratio SAC, regularizers, continual streams, diagnostics."""

__version__ = "0.1.0"
