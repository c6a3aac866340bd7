"""Regularizers and interventions for actor, critic and supervised models, built by name.

>>> from sac_spectral.regularizers import Spectral
>>> reg = Spectral(model, coef=1e-3)          # doctest: +SKIP
>>> loss = task_loss + reg.penalty()          # doctest: +SKIP
"""

from sac_spectral.regularizers.base import Regularizer, penalized_step, regularized_step
from sac_spectral.regularizers.cbp import CBP
from sac_spectral.regularizers.l2 import L2
from sac_spectral.regularizers.l2_init import L2Init
from sac_spectral.regularizers.nap import NaP
from sac_spectral.regularizers.parseval import Parseval
from sac_spectral.regularizers.plasticity_injection import PlasticityInjection
from sac_spectral.regularizers.redo import ReDo
from sac_spectral.regularizers.registry import (
    REGISTRY,
    acts_at,
    build_regularizers,
    parameter_copies,
    register,
    validate_specs,
)
from sac_spectral.regularizers.reset import Reset
from sac_spectral.regularizers.shrink_perturb import ShrinkPerturb
from sac_spectral.regularizers.spectral import Spectral
from sac_spectral.regularizers.spectral_norm import SpectralNorm
from sac_spectral.regularizers.wasserstein_init import WassersteinInit

__all__ = [
    "CBP", "L2", "L2Init", "NaP", "Parseval", "PlasticityInjection", "REGISTRY", "ReDo", "Regularizer", "Reset",
    "ShrinkPerturb", "Spectral", "SpectralNorm", "WassersteinInit", "acts_at", "build_regularizers", "parameter_copies",
    "penalized_step", "register", "regularized_step", "validate_specs",
]
