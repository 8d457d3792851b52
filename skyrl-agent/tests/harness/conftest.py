"""Shared by the harness tests: the tiny tokenizer, and the oracle engine that keeps what it returned."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The tiny model's tokenizer (built locally), with no context limit of its own."""
    skyrl_train_tiny = pytest.importorskip("skyrl_train.models.tiny", reason="skyrl-train is not installed")
    tok = skyrl_train_tiny.build_tokenizer()
    tok.model_max_length = 1 << 20
    return tok


@pytest.fixture
def recording_oracle() -> Callable[[Any, Any], Any]:
    """Makes the scripted oracle engine, keeping every output's ids in ``outputs``."""
    from skyrl_agent.integrations.harness import OracleEngine

    class RecordingOracle(OracleEngine):
        def __init__(self, tokenizer: Any, tasks: Any) -> None:
            super().__init__(tokenizer, tasks)
            self.outputs: list[list[int]] = []

        async def generate(self, prompts: Sequence[Sequence[int]], params: Any) -> list[Any]:
            outputs = await super().generate(prompts, params)
            self.outputs.extend(list(out.token_ids) for out in outputs)
            return outputs

    return RecordingOracle
