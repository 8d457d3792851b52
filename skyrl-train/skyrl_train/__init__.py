"""skyrl-train: a gradient-only reinforcement-learning trainer for LLM agents."""

__version__ = "0.1.0"
