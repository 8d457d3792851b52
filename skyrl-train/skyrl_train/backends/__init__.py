"""Training backends behind the gradient-only :class:`TrainingBackend` protocol."""

from skyrl_train.backends.base import LossFn, LossMetrics, ModelOutput, TrainingBackend, TrainingBatch
from skyrl_train.backends.config import BackendConfig, LoraConfig, OptimizerConfig
from skyrl_train.backends.torch_backend import TorchBackend

__all__ = [
    "BackendConfig",
    "LoraConfig",
    "LossFn",
    "LossMetrics",
    "ModelOutput",
    "OptimizerConfig",
    "TorchBackend",
    "TrainingBackend",
    "TrainingBatch",
]
