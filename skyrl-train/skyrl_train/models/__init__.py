"""Model builders. :mod:`skyrl_train.models.tiny` builds the deterministic tiny test model."""
