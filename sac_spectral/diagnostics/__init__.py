"""Diagnostics of plasticity: gradient rank, weight and feature spectra, dormant units, low-rank gradients.

- :mod:`~sac_spectral.diagnostics.metrics`: erank, stable rank, numerical rank, condition number.
- :mod:`~sac_spectral.diagnostics.gradients`: per-example gradient matrices (``torch.func``) and spectra.
- :mod:`~sac_spectral.diagnostics.spectra`: exact weight singular values per layer and member.
- :mod:`~sac_spectral.diagnostics.features`: feature rank, ReDo dormant scores.
- :mod:`~sac_spectral.diagnostics.report`: everything for one network as TensorBoard tags.
- :mod:`~sac_spectral.agents.probes`: SAC loss closures, probe batches, the ``diagnostics`` config.
- :mod:`~sac_spectral.diagnostics.lowrank`: the spiked-covariance low-rank gradient lab.
"""

from sac_spectral.diagnostics.features import (
    dormant_fraction,
    dormant_scores,
    feature_spectrum,
    hidden_activations,
)
from sac_spectral.diagnostics.gradients import (
    gradient_grams,
    gradient_matrix,
    gradient_spectra,
    members_of,
    per_example_gradients,
)
from sac_spectral.diagnostics.metrics import (
    condition_number,
    effective_rank,
    numerical_rank,
    spectrum_summary,
    stable_rank,
)
from sac_spectral.diagnostics.report import (
    Report,
    as_floats,
    model_diagnostics,
    network_diagnostics,
)
from sac_spectral.diagnostics.spectra import (
    layer_sigma_max,
    weight_singular_values,
    weight_spectra,
)

__all__ = [
    "Report",
    "as_floats",
    "condition_number",
    "dormant_fraction",
    "dormant_scores",
    "effective_rank",
    "feature_spectrum",
    "gradient_grams",
    "gradient_matrix",
    "gradient_spectra",
    "hidden_activations",
    "layer_sigma_max",
    "members_of",
    "model_diagnostics",
    "network_diagnostics",
    "numerical_rank",
    "per_example_gradients",
    "spectrum_summary",
    "stable_rank",
    "weight_singular_values",
    "weight_spectra",
]
