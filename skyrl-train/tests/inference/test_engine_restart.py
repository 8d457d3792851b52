"""An engine actor that Ray restarted while it was idle serves the group's latest weights, never ``model_path``'s.

The restart runs the actor's ``__init__`` again, which loads the model from ``model_path``: the weights of
version 0. No request was running on it when it died, so no failed request tells the group to catch it up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_train.inference.base import GenerationOutput, SamplingParams

from .conftest import ForwardLogprobs, load_model, perturbed_weights

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e ./skyrl-train")

from skyrl_train.inference.ray_engines import EngineGroup  # noqa: E402
from skyrl_train.inference.versioned import VersionedEngine  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROMPTS = [[5, 17, 30 + k, 44, 9] for k in range(4)]
PARAMS = SamplingParams(max_tokens=8, temperature=1.0, logprobs=True, seed=5)
RESTART_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


async def _restarted(handle: Any) -> None:
    """Return once the actor answers from a new incarnation (one holding version 0 again)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RESTART_TIMEOUT_S
    while loop.time() < deadline:
        try:
            if await handle.loaded_version.remote() == 0:
                return
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            pass  # dying, or not back yet
        await asyncio.sleep(0.2)
    raise AssertionError("the killed engine actor did not come back")


def test_an_engine_restarted_while_idle_serves_the_latest_weights(
    cluster: None, tiny_model_dir: Path, trainer_logprobs: ForwardLogprobs
) -> None:
    updated = load_model(tiny_model_dir)
    weights = perturbed_weights(updated, seed=3)  # ``updated`` now holds them too

    async def scenario() -> list[GenerationOutput]:
        group = EngineGroup("local", str(tiny_model_dir), 2, num_cpus_per_engine=0.5, options={"pause_at": "token"})
        engine = VersionedEngine(group)  # as a fully_async run serves the group: tokens carry their version
        try:
            await engine.pause()
            await engine.update_weights(weights)
            engine.version = 1
            await engine.resume()
            for handle in group.engines:  # both engines die while nothing runs on them
                ray.kill(handle, no_restart=False)
            for handle in group.engines:
                await _restarted(handle)
            return await asyncio.wait_for(engine.generate(PROMPTS, PARAMS), timeout=120)
        finally:
            await group.close()

    outputs = asyncio.run(scenario())
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        assert output.token_policy_versions == [1] * len(output.token_ids)
        assert output.logprobs is not None
        expected = trainer_logprobs(updated, prompt, output.token_ids, PARAMS.temperature)
        torch.testing.assert_close(torch.tensor(output.logprobs), expected, atol=1e-4, rtol=1e-4)
