"""mini-swe-agent, installed from PyPI and unmodified, played by the scripted oracle behind skyrl-train's gateway.

Host subprocess sandboxes (the process backend) keep these fast; ``integration_tests/test_harness_cli.py`` runs the
documented command in Docker.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (the skyrl-agent[mini-swe-agent] extra)")
pytest.importorskip("skyrl_train.gateway", reason="the gateway lives in skyrl-train, which is not installed")

from skyrl_agent.cli import main
from skyrl_agent.dispatch import DispatcherConfig, Episode, StageLimits, Timeouts
from skyrl_agent.dispatch.outcomes import Outcome
from skyrl_agent.harness import HarnessJob, HarnessPipeline, HarnessResult
from skyrl_agent.harness.mini_swe_agent import APPLY_THOUGHT, MiniSWEAgent, oracle_replies
from skyrl_agent.integrations.harness import GatewaySessions, OracleEngine
from skyrl_agent.llm.scripted import null_policy
from skyrl_agent.sandbox.process_backend import ProcessBackend
from skyrl_agent.tasks import load_suite


def test_cli_oracle_resolves_the_suite_and_records_token_ids(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["run", "--harness", "mini-swe-agent", "--model", "scripted:oracle", "--backend", "process"]
    assert main([*args, "--concurrency", "4", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert summary["harness"] == "mini-swe-agent"
    assert summary["episodes"] == len(load_suite()) == len(records)
    assert summary["resolved_rate"] >= 0.9
    assert summary["llm_s"] > 0  # the gateway timed the engine's calls
    for record in records:
        assert record["harness"]["exit_status"] == "Submitted", record["task_id"]
        assert record["finish_reason"] == "submitted"
        assert record["harness"]["samples"] == 1  # the oracle's two calls extend one conversation: one sample
        assert len(record["turns"]) == record["harness"]["model_calls"] == 2
        for turn in record["turns"]:
            assert turn["token_ids"]
            assert len(turn["logprobs"]) == len(turn["token_ids"])
            assert turn["logprobs"] == [-0.1] * len(turn["token_ids"])
        # Token in, token out: the second call's prompt extends the first's prompt and reply.
        first, second = record["turns"]
        assert second["prompt_token_ids"][: len(first["prompt_token_ids"]) + len(first["token_ids"])] == (
            first["prompt_token_ids"] + first["token_ids"]
        )
        assert [m["role"] for m in record["messages"]] == ["system", "user", "assistant", "user", "assistant", "exit"]
        assert APPLY_THOUGHT in record["messages"][2]["content"]  # mini-swe-agent's own prompts went to the model
        assert "<pr_description>" in record["messages"][1]["content"]


def _pipeline(backend: ProcessBackend, harness: Any, server: Any, **kwargs: Any) -> HarnessPipeline:
    from skyrl_agent.agents.react import AgentConfig

    return HarnessPipeline(backend, AgentConfig(max_turns=kwargs.pop("max_turns", 5)), harness=harness, server=server)


def test_recorded_ids_are_the_engine_ids_bitwise(tokenizer: Any, recording_oracle: Any) -> None:
    from skyrl_train.gateway import Gateway, GatewayConfig

    tasks = load_suite()[:3]
    engine = recording_oracle(tokenizer, tasks)

    async def go() -> Any:
        async with Gateway(engine, tokenizer, GatewayConfig(max_model_len=1 << 20)) as gateway:
            pipeline = _pipeline(ProcessBackend(), MiniSWEAgent(), GatewaySessions(gateway))
            episodes = [Episode(task.id, {"task": task, "task_id": task.id}) for task in tasks]
            return await pipeline.dispatcher(null_policy()).run(episodes)

    results = asyncio.run(go()).results
    assert all(result.outcome is Outcome.RESOLVED for result in results)
    recorded = []
    for result in results:
        (sample,) = result.trajectory.samples
        sampled = [sample.response_ids[t.start : t.end] for t in sample.turns]
        recorded += sampled
        # The loss mask is 1 on exactly the sampled replies; everything between them is context.
        mask = [0] * len(sample.response_ids)
        for turn in sample.turns:
            mask[turn.start : turn.end] = [1] * (turn.end - turn.start)
        assert sample.loss_mask == mask
        task = result.episode.data["task"]
        replies = oracle_replies(task.gold_patch)
        assert [tokenizer.decode(ids, skip_special_tokens=True) for ids in sampled] == replies
    assert sorted(map(tuple, recorded)) == sorted(map(tuple, engine.outputs))


class Looping:
    """A harness that runs ``sleep 1`` until its shell refuses: it only stops when the episode is over."""

    name = "looping"

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.commands = 0

    def __call__(self, job: HarnessJob) -> HarnessResult:
        try:
            while True:
                job.shell.run("sleep 1")
                self.commands += 1
        finally:
            self.stopped.set()


def test_a_harness_past_its_deadline_times_out_and_its_thread_stops() -> None:
    harness = Looping()

    class NoServer:
        model = "policy"

        def open_session(self, session_id: str) -> Any:
            from skyrl_agent.harness import SessionTicket

            return SessionTicket(session_id, "http://127.0.0.1:9/v1", session_id)

        def close_session(self, session_id: str) -> list[Any]:
            return []

    task = load_suite()[0]
    pipeline = _pipeline(ProcessBackend(), harness, NoServer())
    timeouts = Timeouts(episode_s=2.5, llm_call_s=None, tool_call_s=None, sandbox_start_s=None, grade_s=None)
    config = DispatcherConfig(limits=StageLimits(), timeouts=timeouts)
    dispatched = asyncio.run(pipeline.dispatcher(null_policy(), config).run([Episode(task.id, {"task": task})]))
    (result,) = dispatched.results
    assert result.outcome is Outcome.TIMED_OUT, result.error
    assert harness.stopped.wait(5), "the harness thread kept running after its episode ended"
    assert 1 <= harness.commands <= 4


class Recorder:
    """An OpenAI-compatible front that records each request body, then answers it from ``upstream``.

    ``upstream`` is a base URL ending in ``/v1`` (a gateway session's, or a plain server's). With ``upstream``
    None it is itself the plain server: it answers chat requests with the oracle's replies (no tokens recorded).
    """

    def __init__(self, oracle: OracleEngine, upstream: str | None = None) -> None:
        self.oracle, self.upstream = oracle, upstream
        self.bodies: list[tuple[str, Any]] = []
        self.url = ""
        self._runner: Any = None

    async def start(self) -> str:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/v1"
        return self.url

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _handle(self, request: Any) -> Any:
        import aiohttp
        from aiohttp import web

        body = await request.json()
        self.bodies.append((request.match_info["tail"], body))
        if self.upstream is None:
            return web.json_response(self._answer(body))
        url = f"{self.upstream}/{request.match_info['tail']}"
        async with aiohttp.ClientSession() as client, client.post(url, json=body) as upstream:
            return web.json_response(await upstream.json(), status=upstream.status)

    def _answer(self, body: Any) -> dict[str, Any]:
        text = self.oracle.reply("\n".join(str(m.get("content", "")) for m in body["messages"]))
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return {"id": "chatcmpl-plain", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [choice], "usage": usage}  # fmt: skip


def test_the_harness_sends_the_gateway_the_requests_it_sends_a_plain_server(tokenizer: Any) -> None:
    """What is trained is what is deployed: the same harness, the same task, the same request bodies."""
    from skyrl_agent.agents.react import AgentConfig
    from skyrl_agent.harness import Endpoint
    from skyrl_train.gateway import Gateway, GatewayConfig

    task = load_suite()[0]
    engine = OracleEngine(tokenizer, [task])

    async def episode(endpoint: Endpoint) -> Any:
        agent = AgentConfig(max_turns=5)
        pipeline = HarnessPipeline(ProcessBackend(), agent, harness=MiniSWEAgent(), endpoint=endpoint)
        (result,) = (await pipeline.dispatcher(null_policy()).run([Episode(task.id, {"task": task})])).results
        return result

    async def go() -> tuple[Recorder, Recorder, Any, Any, list[Any]]:
        async with Gateway(engine, tokenizer, GatewayConfig(model_name="policy", max_model_len=1 << 20)) as gateway:
            session = gateway.open_session("same-requests")
            trained = Recorder(engine, upstream=session.base_url)
            deployed = Recorder(engine)
            await trained.start()
            await deployed.start()
            try:
                trained_result = await episode(Endpoint(trained.url, session.api_key, "policy"))
                deployed_result = await episode(Endpoint(deployed.url, "any-key", "policy"))
            finally:
                await trained.stop()
                await deployed.stop()
            return trained, deployed, trained_result, deployed_result, gateway.close_session("same-requests")

    trained, deployed, trained_result, deployed_result, samples = asyncio.run(go())
    assert trained_result.outcome is deployed_result.outcome is Outcome.RESOLVED
    assert [path for path, _ in trained.bodies] == ["chat/completions"] * 2
    assert trained.bodies == deployed.bodies  # byte for byte the same JSON bodies
    (sample,) = samples  # and the gateway recorded the trained run's two calls as one sample
    assert len(sample.turns) == 2
