"""Continual supervised learning: datasets, task streams, models and the learner."""

from sac_spectral.core.optim import make_optimizer
from sac_spectral.supervised.datasets import (
    DATASETS,
    DataError,
    Dataset,
    SyntheticSpec,
    load_dataset,
)
from sac_spectral.supervised.learner import (
    ContinualLearner,
    Probe,
    weight_sigma_max,
)
from sac_spectral.supervised.models import MODELS, build_model
from sac_spectral.supervised.streams import (
    STREAMS,
    ClassificationTask,
    LinearTargetTask,
    Stream,
)

__all__ = [
    "DATASETS", "MODELS", "STREAMS", "ClassificationTask", "ContinualLearner", "DataError", "Dataset",
    "LinearTargetTask", "Probe", "Stream", "SyntheticSpec", "build_model", "load_dataset",
    "make_optimizer", "weight_sigma_max",
]
