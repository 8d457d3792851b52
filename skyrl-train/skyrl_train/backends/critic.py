"""A value model for PPO behind the same backend API: a causal LM trunk with a scalar head per position.

The model is Hugging Face's ``*ForTokenClassification`` with one label (for Qwen2: ``Qwen2ForTokenClassification``,
the decoder trunk plus a ``score`` linear layer), loaded from a causal LM checkpoint: the trunk weights are reused
and the head is initialised from the seed. So a critic checkpoint exported with ``export_hf`` is an ordinary
Hugging Face directory (``AutoModelForTokenClassification`` loads it) and can itself be a starting ``model_path``.

The value of response token ``t`` is read at the position before it, the state in which the token was chosen,
aligned exactly like the policy's log-probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skyrl_train.backends.base import ModelOutput
from skyrl_train.backends.packing import ModelInputs
from skyrl_train.backends.torch_backend import TorchBackend, check_model_path

VALUE_HEAD = "score"  # the head's module name in Hugging Face token-classification models


class CriticBackend(TorchBackend):
    """A value model trained in this process; ``forward``/``forward_backward`` fill ``ModelOutput.values``.

    ``ModelOutput.log_probs`` of a critic is an empty ``[b, 0]`` tensor (the field is required by the protocol; a
    critic has no token distribution), ``temperature`` is ignored and ``with_entropy`` is rejected. With LoRA the
    value head is trained in full next to the adapters.
    """

    def _load_model(self) -> Any:
        from transformers import AutoConfig, AutoModelForTokenClassification

        check_model_path(self.config.model_path)
        config = AutoConfig.from_pretrained(self.config.model_path, num_labels=1)
        config.classifier_dropout = 0.0  # no dropout on the head: value estimates must not be noisy in training
        return AutoModelForTokenClassification.from_pretrained(
            self.config.model_path, config=config, **self._load_kwargs()
        )

    def _extra_trainable_modules(self) -> Sequence[str]:
        return (VALUE_HEAD,)

    def _micro_output(self, inputs: ModelInputs, temperature: float, with_entropy: bool) -> ModelOutput:
        """Values ``[b, T]`` (float32, 0 on padding) of one micro-batch laid out on the device."""
        if with_entropy:
            raise ValueError("a critic has no token distribution: call it with with_entropy=False")
        with self._compute_context():
            scores = self.model(**inputs.model_kwargs()).logits  # [R, N, 1]
        values = inputs.scatter(scores[inputs.rows, inputs.cols, 0].float())
        return ModelOutput(log_probs=values.new_zeros(values.shape[0], 0), values=values)
