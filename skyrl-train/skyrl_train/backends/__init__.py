"""Training backends behind the gradient-only :class:`TrainingBackend` protocol."""

from skyrl_train.backends.base import LossFn, ModelOutput, TrainingBackend, TrainingBatch
from skyrl_train.backends.config import BackendConfig, LoraConfig, OptimizerConfig
from skyrl_train.backends.torch_backend import TorchBackend

__all__ = [
    "BackendConfig",
    "LoraConfig",
    "LossFn",
    "ModelOutput",
    "OptimizerConfig",
    "TorchBackend",
    "TrainingBackend",
    "TrainingBatch",
]
