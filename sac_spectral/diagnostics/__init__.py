"""Diagnostics of plasticity: gradient rank, weight and feature spectra, dormant units, low-rank gradients.

- :mod:`~sac_spectral.diagnostics.metrics`: erank, Frobenius stable rank, numerical rank, condition number.
- :mod:`~sac_spectral.diagnostics.plasticity`: Plasticine's and SimbaV2's metrics per member (srank_δ,
  feature norm, active units, weight magnitude, distance from init, gradient norm, effective lr, churn).
- :mod:`~sac_spectral.diagnostics.gradients`: per-example gradient matrices (``torch.func``) and spectra.
- :mod:`~sac_spectral.diagnostics.spectra`: exact weight singular values per layer and member.
- :mod:`~sac_spectral.diagnostics.features`: feature rank, ReDo dormant scores.
- :mod:`~sac_spectral.diagnostics.report`: everything for one network as TensorBoard tags.
- :mod:`~sac_spectral.agents.probes`: the agents' loss closures, probe batches, the ``diagnostics`` config.
- :mod:`~sac_spectral.diagnostics.lowrank`: the spiked-covariance low-rank gradient lab.
"""

from sac_spectral.diagnostics.features import (
    dormant_fraction,
    dormant_scores,
    feature_spectrum,
    hidden_activations,
)
from sac_spectral.diagnostics.gradients import (
    coupled_gradients,
    gradient_grams,
    gradient_matrix,
    gradient_spectra,
    members_of,
    per_example_gradients,
)
from sac_spectral.diagnostics.metrics import (
    condition_number,
    effective_rank,
    frobenius_stable_rank,
    numerical_rank,
    spectrum_summary,
)
from sac_spectral.diagnostics.plasticity import (
    ParamSnapshot,
    UpdateProbe,
    active_fraction,
    churn,
    effective_lr,
    feature_metrics,
    feature_norm,
    feature_srank,
    grad_norm,
    reference_outputs,
    srank,
    weight_magnitude,
    weight_metrics,
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
    "ParamSnapshot",
    "Report",
    "UpdateProbe",
    "active_fraction",
    "as_floats",
    "churn",
    "condition_number",
    "coupled_gradients",
    "dormant_fraction",
    "dormant_scores",
    "effective_lr",
    "effective_rank",
    "feature_metrics",
    "feature_norm",
    "feature_spectrum",
    "feature_srank",
    "frobenius_stable_rank",
    "grad_norm",
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
    "reference_outputs",
    "spectrum_summary",
    "srank",
    "weight_magnitude",
    "weight_metrics",
    "weight_singular_values",
    "weight_spectra",
]
