"""A command-line harness: a program using the ``openai`` SDK, run in the sandbox against a gateway session."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai", reason="the openai SDK is not installed (the dev group)")
pytest.importorskip("skyrl_train.gateway", reason="the gateway lives in skyrl-train, which is not installed")

from skyrl_agent.agents.react import AgentConfig
from skyrl_agent.dispatch import Episode
from skyrl_agent.dispatch.outcomes import Outcome
from skyrl_agent.harness import CommandHarness, HarnessPipeline
from skyrl_agent.integrations.harness import GatewaySessions
from skyrl_agent.integrations.serving import make_harness
from skyrl_agent.llm.scripted import null_policy
from skyrl_agent.sandbox.process_backend import ProcessBackend
from skyrl_agent.tasks import load_suite

AGENT = textwrap.dedent('''
    """One model call; run the reply's bash block in the repository; exit 0."""
    import os, re, subprocess
    from openai import OpenAI

    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from the harness's environment
    reply = client.chat.completions.create(
        model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": os.environ["SKYRL_TASK"]}]
    ).choices[0].message.content
    (command,) = re.findall(r"```mswea_bash_command\\n(.*?)\\n```", reply, re.S)
    print(subprocess.run(["bash", "-c", command], capture_output=True, text=True).returncode)
''')


def _episode(tokenizer: Any, oracle: Any, harness: Any) -> tuple[Any, Any]:
    from skyrl_train.gateway import Gateway, GatewayConfig

    task = load_suite()[0]
    engine = oracle(tokenizer, [task])

    async def go() -> Any:
        async with Gateway(engine, tokenizer, GatewayConfig(max_model_len=1 << 20)) as gateway:
            pipeline = HarnessPipeline(
                ProcessBackend(), AgentConfig(max_turns=3), harness=harness, server=GatewaySessions(gateway)
            )
            (result,) = (await pipeline.dispatcher(null_policy()).run([Episode(task.id, {"task": task})])).results
            return result

    return asyncio.run(go()), engine


def test_a_program_run_in_the_sandbox_is_recorded_and_graded(
    tmp_path: Path, tokenizer: Any, recording_oracle: Any
) -> None:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    result, engine = _episode(tokenizer, recording_oracle, CommandHarness([sys.executable, str(script)]))
    assert result.outcome is Outcome.RESOLVED, result.error  # the oracle's reply applied the gold patch
    trajectory = result.trajectory
    assert trajectory.result.exit_status == "Submitted"
    assert trajectory.result.messages[0]["content"].strip() == "0"  # the script's own output: the command's status
    (sample,) = trajectory.samples
    (turn,) = sample.turns
    assert sample.response_ids[turn.start : turn.end] == engine.outputs[0]


def test_a_program_that_fails_is_still_graded(tokenizer: Any, recording_oracle: Any) -> None:
    result, _ = _episode(tokenizer, recording_oracle, CommandHarness([sys.executable, "-c", "raise SystemExit(3)"]))
    assert result.outcome is Outcome.UNRESOLVED  # graded: its diff (none) does not pass the hidden tests
    assert result.trajectory.result.exit_status == "exit 3"
    assert result.trajectory.samples == []


def test_harness_names() -> None:
    harness = make_harness("command:python -m my_agent --fast")
    assert isinstance(harness, CommandHarness)
    assert list(harness.argv) == ["python", "-m", "my_agent", "--fast"]
    for bad in ("command:", "nope"):
        with pytest.raises(ValueError, match="harness"):
            make_harness(bad)
