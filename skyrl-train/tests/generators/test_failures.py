"""One trajectory that raises or hangs never fails the batch; env calls never block the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from skyrl_train.generators import GeneratorInput, GeneratorOutput
from skyrl_train.generators.skyrl_gym_generator import (
    FAILURE_STOP_REASONS,
    EngineError,
    EnvError,
    GeneratorConfig,
    SkyRLGymGenerator,
)
from skyrl_train.generators.testing import Reply, ScriptedEngine, by_marker
from skyrl_train.inference.base import GenerationOutput, SamplingParams

DONE = [{"reward": 1.0, "done": True}]
TWO_TURNS = [{"reward": 0.5, "done": False, "observations": [{"role": "user", "content": "go on"}]}, *DONE]


def row(tag: str, steps: list[dict[str, Any]] | None = None, **extras: Any) -> tuple[str, dict[str, Any]]:
    return tag, {"tag": tag, "steps": steps or DONE, **extras}


def make_batch(rows: Sequence[tuple[str, dict[str, Any]]]) -> GeneratorInput:
    return GeneratorInput(
        prompts=[[{"role": "user", "content": f"Task {tag}."}] for tag, _ in rows],
        env_classes=["test_probe"] * len(rows),
        env_extras=[extras for _, extras in rows],
        trajectory_ids=[f"{tag}:0" for tag, _ in rows],
        sampling_params=SamplingParams(max_tokens=32),
    )


def run(engine: Any, tokenizer: PreTrainedTokenizerBase, batch: GeneratorInput, **config: Any) -> GeneratorOutput:
    return asyncio.run(SkyRLGymGenerator(engine, tokenizer, GeneratorConfig(**config)).generate(batch))


def assert_masked(out: GeneratorOutput, i: int) -> None:
    assert out.stop_reasons[i] in FAILURE_STOP_REASONS
    assert set(out.loss_masks[i]) <= {0}
    assert set(out.rewards[i]) <= {0.0}


def healthy_rows(n: int = 3) -> list[tuple[str, dict[str, Any]]]:
    return [row(f"ok{i}", TWO_TURNS) for i in range(n)]


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("where", ["init", "step", "get_metrics", "close"])
def test_env_failure_is_contained(
    tokenizer: PreTrainedTokenizerBase, probe_log: Any, where: str, batched: bool
) -> None:
    steps = DONE if batched else TWO_TURNS
    rows = [
        row("ok0", steps),
        row("bad", [{"raise": True}] if where == "step" else steps, fail_in=where),
        row("ok1", steps),
    ]
    engine = ScriptedEngine(tokenizer, by_marker({}, default="fine"))
    out = run(engine, tokenizer, make_batch(rows), max_turns=1 if batched else 3, batched=batched)

    assert out.stop_reasons == ["stop", "env_error", "stop"]
    assert_masked(out, 1)
    if where in ("step", "get_metrics", "close"):
        assert len(out.response_ids[1]) > 0  # the tokens before the failure are kept, masked
    for i in (0, 2):
        assert out.rewards[i][-1] == 1.0
        assert 1 in out.loss_masks[i]
    assert sorted(probe_log.tagged("close")) == ["bad", "ok0", "ok1"]  # every env is closed
    assert out.metrics["generate/stop_reason/env_error"] == 1


def test_failed_trajectories_do_not_change_the_others(tokenizer: PreTrainedTokenizerBase, probe_log: Any) -> None:
    responder = by_marker({"Task bad-engine": [Reply(fail=True)], "Task hang": [Reply(hang=True)]}, default="fine")
    rows = [*healthy_rows(2), row("bad-env", [{"raise": True}]), row("bad-engine"), row("hang")]
    out = run(ScriptedEngine(tokenizer, responder), tokenizer, make_batch(rows), max_turns=3, timeout_s=0.5)
    assert out.stop_reasons == ["stop", "stop", "env_error", "engine_error", "timeout"]
    for i in (2, 3, 4):
        assert_masked(out, i)
    alone = run(
        ScriptedEngine(tokenizer, by_marker({}, default="fine")), tokenizer, make_batch(healthy_rows(2)), max_turns=3
    )
    assert out.response_ids[:2] == alone.response_ids
    assert out.rewards[:2] == alone.rewards
    assert out.loss_masks[:2] == alone.loss_masks
    assert sorted(probe_log.tagged("close")) == sorted(["ok0", "ok1", "bad-env", "bad-engine", "hang", "ok0", "ok1"])


def test_engine_that_hangs_in_batched_mode_times_out_every_prompt(tokenizer: PreTrainedTokenizerBase) -> None:
    responder = by_marker({"Task hang": [Reply(hang=True)]}, default="fine")
    rows = [row("ok0"), row("hang")]
    out = run(ScriptedEngine(tokenizer, responder), tokenizer, make_batch(rows), batched=True, timeout_s=0.3)
    assert out.stop_reasons == ["timeout", "timeout"]  # one call serves the batch: it fails as a whole


class MalformedEngine(ScriptedEngine):
    """Answers one marker's prompts without the requested logprobs, or with an abort."""

    async def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[GenerationOutput]:
        outputs = await super().generate(prompts, params)
        for prompt, output in zip(prompts, outputs, strict=True):
            text = self.tokenizer.decode(list(prompt))
            if "no-logprobs" in text:
                output.logprobs = None
            if "aborted" in text:
                output.stop_reason = "abort"
        return outputs


def test_malformed_engine_output_is_an_engine_error(tokenizer: PreTrainedTokenizerBase) -> None:
    engine = MalformedEngine(tokenizer, by_marker({}, default="fine"))
    rows = [row("ok0"), row("no-logprobs"), row("aborted")]
    for batched in (False, True):
        out = run(engine, tokenizer, make_batch(rows), batched=batched)
        assert out.stop_reasons == ["stop", "engine_error", "engine_error"]


def test_close_that_hangs_is_bounded(tokenizer: PreTrainedTokenizerBase, probe_log: Any) -> None:
    rows = [row("ok0"), row("slow-close", close_sleep_s=1.0)]
    out = run(
        ScriptedEngine(tokenizer, by_marker({}, default="fine")), tokenizer, make_batch(rows), close_timeout_s=0.1
    )
    assert out.stop_reasons == ["stop", "timeout"]
    assert_masked(out, 1)


def test_unknown_env_class_is_an_env_error(tokenizer: PreTrainedTokenizerBase) -> None:
    batch = make_batch([row("ok0"), row("x")])
    batch.env_classes[1] = "no_such_env"
    out = run(ScriptedEngine(tokenizer, by_marker({}, default="fine")), tokenizer, batch)
    assert out.stop_reasons == ["stop", "env_error"]
    assert out.response_ids[1] == []


def test_raise_policy_runs_the_batch_then_raises(tokenizer: PreTrainedTokenizerBase, probe_log: Any) -> None:
    rows = [row("ok0"), row("bad", [{"raise": True}])]
    with pytest.raises(ExceptionGroup) as caught:
        run(ScriptedEngine(tokenizer, by_marker({}, default="fine")), tokenizer, make_batch(rows), on_failure="raise")
    assert [type(e) for e in caught.value.exceptions] == [EnvError]
    assert isinstance(caught.value.exceptions[0].__cause__, RuntimeError)
    assert sorted(probe_log.tagged("close")) == ["bad", "ok0"]
    assert EngineError.stop_reason == "engine_error"


def test_blocking_env_step_does_not_stall_other_trajectories(
    tokenizer: PreTrainedTokenizerBase, probe_log: Any
) -> None:
    # The slow env's step blocks its thread until the last healthy trajectory's final step opens the gate. If env
    # calls ran on the event loop, no other trajectory could progress and the slow step would give up instead.
    n = 4
    rows = [row("slow", [{"wait_for": "healthy-done", "reward": 1.0, "done": True}])]
    for i in range(n):
        last = [{"reward": 1.0, "done": True, "open": "healthy-done"}] if i == n - 1 else DONE
        rows.append(row(f"ok{i}", [TWO_TURNS[0], *last]))
    # The last healthy trajectory finishes after the others (delayed replies) so all of them ran concurrently.
    responder = by_marker({f"Task ok{n - 1}": [Reply("fine", delay_s=0.05)]}, default="fine")
    out = run(ScriptedEngine(tokenizer, responder), tokenizer, make_batch(rows), max_turns=3)

    assert out.stop_reasons == ["stop"] * (n + 1)
    assert probe_log.tagged("released") == ["slow"]
    events = [e for e in probe_log.events if e[1] in ("step", "stepped", "released")]
    slow_started = events.index(("slow", "step"))
    slow_released = events.index(("slow", "released"))
    healthy_steps_meanwhile = [tag for tag, name in events[slow_started:slow_released] if name == "stepped"]
    assert len(healthy_steps_meanwhile) == 2 * n  # every healthy step ran while the slow one blocked


def test_concurrency_limit_and_input_order(tokenizer: PreTrainedTokenizerBase, probe_log: Any) -> None:
    n = 6
    # Earlier trajectories are slower, so they finish last; the outputs must still come back in input order.
    responder = by_marker({f"Task t{i}": [Reply(f"reply {i}", delay_s=0.01 * (n - i))] for i in range(n)})
    engine = ScriptedEngine(tokenizer, responder)
    rows = [row(f"t{i}", TWO_TURNS) for i in range(n)]
    out = run(engine, tokenizer, make_batch(rows), max_turns=3, max_concurrent_trajectories=2)

    assert engine.max_in_flight == 2
    assert probe_log.max_open_envs == 2
    assert out.trajectory_ids == [f"t{i}:0" for i in range(n)]
    for i in range(n):
        assert tokenizer.decode(out.response_ids[i]).startswith(f"reply {i}")
    assert out.stop_reasons == ["stop"] * n


def test_the_limit_holds_across_concurrent_generate_calls(tokenizer: PreTrainedTokenizerBase, probe_log: Any) -> None:
    # fully_async generates one group per call, many calls at once: the limit is the generator's, not the call's.
    engine = ScriptedEngine(tokenizer, by_marker({}, default=Reply("fine", delay_s=0.02)))
    generator = SkyRLGymGenerator(engine, tokenizer, GeneratorConfig(max_turns=3, max_concurrent_trajectories=2))

    async def groups() -> list[GeneratorOutput]:
        batches = [make_batch([row(f"g{g}t{i}", TWO_TURNS) for i in range(2)]) for g in range(4)]
        return await asyncio.gather(*(generator.generate(batch) for batch in batches))

    outputs = asyncio.run(groups())
    assert engine.max_in_flight == 2
    assert probe_log.max_open_envs == 2
    assert [out.stop_reasons for out in outputs] == [["stop", "stop"]] * 4


def test_without_a_limit_everything_runs_at_once(tokenizer: PreTrainedTokenizerBase, probe_log: Any) -> None:
    n = 5
    engine = ScriptedEngine(tokenizer, by_marker({}, default=Reply("fine", delay_s=0.05)))
    run(engine, tokenizer, make_batch([row(f"t{i}") for i in range(n)]))
    assert engine.max_in_flight == n


def test_own_env_pool(tokenizer: PreTrainedTokenizerBase, probe_log: Any) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({}, default="fine"))
    generator = SkyRLGymGenerator(engine, tokenizer, GeneratorConfig(max_turns=3, max_env_workers=1))
    try:
        out = asyncio.run(generator.generate(make_batch(healthy_rows(3))))
    finally:
        generator.close()
    assert out.stop_reasons == ["stop"] * 3
    assert generator.env_runner.max_workers == 1


def test_inline_env_calls_for_debugging(tokenizer: PreTrainedTokenizerBase, probe_log: Any) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({}, default="fine"))
    generator = SkyRLGymGenerator(engine, tokenizer, GeneratorConfig(max_turns=3, max_env_workers=0))
    out = asyncio.run(generator.generate(make_batch([*healthy_rows(2), row("bad", [{"raise": True}])])))
    assert out.stop_reasons == ["stop", "stop", "env_error"]
    assert sorted(probe_log.tagged("close")) == ["bad", "ok0", "ok1"]
