"""Generators: prompts × environments × an inference engine → token-level trajectories."""

from skyrl_train.generators.base import Generator, GeneratorInput, GeneratorOutput, TrajectoryStopReason

__all__ = ["Generator", "GeneratorInput", "GeneratorOutput", "TrajectoryStopReason"]
