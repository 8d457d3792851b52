"""Generators: prompts × environments × an inference engine → token-level trajectories."""

from skyrl_train.generators.base import (
    FAILURE_STOP_REASONS,
    Generator,
    GeneratorInput,
    GeneratorOutput,
    TrajectoryStopReason,
)
from skyrl_train.generators.factory import GeneratorContext, GeneratorFactory, PausableGenerator
from skyrl_train.generators.skyrl_gym_generator import GeneratorConfig, SkyRLGymGenerator

__all__ = [
    "FAILURE_STOP_REASONS",
    "Generator",
    "GeneratorConfig",
    "GeneratorContext",
    "GeneratorFactory",
    "GeneratorInput",
    "GeneratorOutput",
    "PausableGenerator",
    "SkyRLGymGenerator",
    "TrajectoryStopReason",
]
