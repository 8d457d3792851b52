"""Inference engines behind one protocol (:class:`InferenceEngine`)."""

from skyrl_train.inference.base import GenerationOutput, InferenceEngine, SamplingParams, StopReason

__all__ = ["GenerationOutput", "InferenceEngine", "SamplingParams", "StopReason"]
