"""Diagnostics of plasticity: weight spectra (and, built on them, gradient and feature ranks)."""

from sac_spectral.diagnostics.spectra import layer_sigma_max, weight_singular_values

__all__ = ["layer_sigma_max", "weight_singular_values"]
