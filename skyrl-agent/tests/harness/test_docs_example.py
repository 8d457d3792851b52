"""The "any OpenAI-client agent" example of ``docs/agent/harnesses.md`` runs as printed, through the gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai", reason="the openai SDK is not installed (the dev group)")
pytest.importorskip("skyrl_train.gateway", reason="the gateway lives in skyrl-train, which is not installed")

from skyrl_agent.agents.react import AgentConfig
from skyrl_agent.dispatch import Episode
from skyrl_agent.dispatch.outcomes import Outcome
from skyrl_agent.harness import HarnessPipeline
from skyrl_agent.integrations.harness import GatewaySessions, OracleEngine
from skyrl_agent.llm.scripted import null_policy
from skyrl_agent.tasks import load_suite

PAGE = Path(__file__).resolve().parents[3] / "docs" / "agent" / "harnesses.md"


def documented_agent() -> type:
    """The page's ``MyAgent``, executed from the page's own code block."""
    blocks = [block.split("```", 1)[0] for block in PAGE.read_text().split("```python\n")[1:]]
    (code,) = [block for block in blocks if "class MyAgent" in block]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace["MyAgent"]


class Replies(OracleEngine):
    """Answers ``ls`` first, then ``echo DONE``."""

    def reply(self, prompt_text: str) -> str:
        return "echo DONE" if "<|im_start|>assistant\nls" in prompt_text else "ls"


def test_the_documented_agent_runs_through_the_gateway(tokenizer: Any) -> None:
    from skyrl_train.gateway import Gateway, GatewayConfig

    task = load_suite()[0]
    engine = Replies(tokenizer, [task])

    async def go() -> Any:
        async with Gateway(engine, tokenizer, GatewayConfig(max_model_len=1 << 20)) as gateway:
            from skyrl_agent.sandbox.process_backend import ProcessBackend

            pipeline = HarnessPipeline(
                ProcessBackend(),
                AgentConfig(max_turns=4),
                harness=documented_agent()(),
                server=GatewaySessions(gateway),
            )
            (result,) = (await pipeline.dispatcher(null_policy()).run([Episode(task.id, {"task": task})])).results
            return result

    result = asyncio.run(go())
    assert result.outcome is Outcome.UNRESOLVED  # graded: it changed nothing
    assert result.trajectory.result.exit_status == "Submitted"
    assert result.trajectory.result.model_calls == 2
    (sample,) = result.trajectory.samples  # the second request extended the first: one sample, two replies
    assert len(sample.turns) == 2
