"""skyrl-agent: long-horizon LLM agent episodes in sandboxes."""

__version__ = "0.1.0"
