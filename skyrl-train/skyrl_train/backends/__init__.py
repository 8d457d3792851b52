"""Training backends behind the gradient-only :class:`TrainingBackend` protocol."""

from skyrl_train.backends.base import LossFn, ModelOutput, TrainingBackend, TrainingBatch

__all__ = ["LossFn", "ModelOutput", "TrainingBackend", "TrainingBatch"]
