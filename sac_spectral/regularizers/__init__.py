"""Regularizers and interventions for actor, critic and supervised models, built by name.

>>> from sac_spectral.regularizers import Spectral
>>> reg = Spectral(model, coef=1e-3)          # doctest: +SKIP
>>> loss = task_loss + reg.penalty()          # doctest: +SKIP
"""

from sac_spectral.regularizers.base import Regularizer
from sac_spectral.regularizers.registry import REGISTRY, build_regularizers, register, validate_specs
from sac_spectral.regularizers.spectral import Spectral

__all__ = ["REGISTRY", "Regularizer", "Spectral", "build_regularizers", "register", "validate_specs"]
