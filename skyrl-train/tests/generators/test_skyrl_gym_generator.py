"""SkyRLGymGenerator with the scripted engine: token bookkeeping, rewards, stop reasons, limits, batched mode."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from skyrl_gym.envs.gsm8k.multi_turn_env import MISSING_ANSWER_FEEDBACK, WRONG_ANSWER_FEEDBACK
from skyrl_train.generators import Generator, GeneratorInput, GeneratorOutput
from skyrl_train.generators.chat import ChatEncoder, encode, render
from skyrl_train.generators.skyrl_gym_generator import GeneratorConfig, SkyRLGymGenerator
from skyrl_train.generators.testing import Reply, ScriptedEngine, by_marker, scripted_logprob
from skyrl_train.inference.base import SamplingParams


def question(marker: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Problem {marker}: what is 20 + 2? End with #### <number>."}]


def gsm8k_extras(answer: str = "22") -> dict[str, Any]:
    return {"reward_spec": {"method": "rule", "ground_truth": answer}}


def make_batch(
    rows: list[tuple[str, str, dict[str, Any]]],
    params: SamplingParams | None = None,
    training: bool = True,
) -> GeneratorInput:
    """rows: (marker, env class, extras)."""
    return GeneratorInput(
        prompts=[question(marker) for marker, _, _ in rows],
        env_classes=[env_class for _, env_class, _ in rows],
        env_extras=[extras for _, _, extras in rows],
        trajectory_ids=[f"{marker}:0" for marker, _, _ in rows],
        sampling_params=params or SamplingParams(max_tokens=64),
        training=training,
    )


def generate(
    engine: ScriptedEngine, tokenizer: PreTrainedTokenizerBase, batch: GeneratorInput, **config: Any
) -> GeneratorOutput:
    generator = SkyRLGymGenerator(engine, tokenizer, GeneratorConfig(**config))
    assert isinstance(generator, Generator)
    return asyncio.run(generator.generate(batch))


def assert_aligned(out: GeneratorOutput) -> None:
    assert out.rollout_logprobs is not None
    for i in range(len(out)):
        n = len(out.response_ids[i])
        assert len(out.loss_masks[i]) == n
        assert len(out.rewards[i]) == n
        assert len(out.rollout_logprobs[i]) == n
        for mask, logprob in zip(out.loss_masks[i], out.rollout_logprobs[i], strict=True):
            if mask == 0:
                assert logprob == 0.0


def test_single_turn_gsm8k(tokenizer: PreTrainedTokenizerBase) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({"A1": ["20 + 2 = 22\n#### 22"], "B2": ["20 + 2 = 23\n#### 23"]}))
    batch = make_batch([("A1", "gsm8k", gsm8k_extras()), ("B2", "gsm8k", gsm8k_extras())])
    out = generate(engine, tokenizer, batch)

    assert_aligned(out)
    assert out.trajectory_ids == ["A1:0", "B2:0"]
    assert out.stop_reasons == ["stop", "stop"]
    eos = tokenizer.eos_token_id
    for i, text in enumerate(["20 + 2 = 22\n#### 22", "20 + 2 = 23\n#### 23"]):
        expected = [*encode(tokenizer, text), eos]
        assert out.response_ids[i] == expected  # the engine's ids, EOS included, never re-tokenized
        assert out.loss_masks[i] == [1] * len(expected)
        assert out.rollout_logprobs is not None
        assert out.rollout_logprobs[i] == [scripted_logprob(t, p) for p, t in enumerate(expected)]
        prompt_text = render(tokenizer, batch.prompts[i], add_generation_prompt=True)
        assert out.prompt_token_ids[i] == encode(tokenizer, prompt_text)
    assert sorted(r.prompt_ids for r in engine.requests) == sorted(out.prompt_token_ids)
    assert out.rewards[0] == [0.0] * (len(out.rewards[0]) - 1) + [1.0]  # on the last generated token (the EOS)
    assert out.rewards[1] == [0.0] * len(out.rewards[1])
    assert out.metrics["environment/gsm8k/avg_reward"] == 0.5
    assert out.metrics["generate/stop_reason/stop"] == 2
    assert out.metrics["generate/num_turns/max"] == 1
    assert out.metrics["generate/num_tokens/min"] == min(len(r) for r in out.response_ids)
    assert out.env_metrics == [{}, {}]


def test_sampling_params_reach_the_engine(tokenizer: PreTrainedTokenizerBase) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({"A1": ["#### 22"]}))
    params = SamplingParams(max_tokens=40, temperature=0.7, seed=3)
    generate(engine, tokenizer, make_batch([("A1", "gsm8k", gsm8k_extras())], params), max_generate_length=30)
    sent = engine.requests[0].params
    assert (sent.temperature, sent.seed, sent.max_tokens) == (0.7, 3, 30)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in sent.stop_token_ids


def test_seeds_differ_per_trajectory_and_turn(tokenizer: PreTrainedTokenizerBase) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({}, default="#### 1"))
    rows = [(marker, "gsm8k_multi_turn", gsm8k_extras()) for marker in ("A1", "B2")]
    generate(engine, tokenizer, make_batch(rows, SamplingParams(seed=10)), max_turns=2)
    seeds = sorted(r.params.seed for r in engine.requests if r.params.seed is not None)
    assert seeds == [10, 11, 12, 13]  # seed + index + turn * batch size


def test_multi_turn_rewards_and_masks(tokenizer: PreTrainedTokenizerBase) -> None:
    replies = ["20 + 2 = 24\n#### 24", "I am not sure.", "20 + 2 = 22\n#### 22"]
    engine = ScriptedEngine(tokenizer, by_marker({"M1": replies}))
    extras = gsm8k_extras()
    out = generate(engine, tokenizer, make_batch([("M1", "gsm8k_multi_turn", extras)]), max_turns=5)

    assert_aligned(out)
    assert out.stop_reasons == ["stop"]
    assert out.env_metrics == [{"steps": 3}]
    encoder = ChatEncoder(tokenizer)
    eos = tokenizer.eos_token_id
    feedback = [WRONG_ANSWER_FEEDBACK, MISSING_ANSWER_FEEDBACK]
    expected_ids: list[int] = []
    expected_mask: list[int] = []
    expected_rewards: list[float] = []
    for turn, (reply, reward) in enumerate(zip(replies, [0.2 / 5, 0.0, 1.0], strict=True)):
        generated = [*encode(tokenizer, reply), eos]
        expected_ids += generated
        expected_mask += [1] * len(generated)
        expected_rewards += [0.0] * (len(generated) - 1) + [reward]
        if turn < 2:
            observation = encoder.observation_ids([{"role": "user", "content": feedback[turn]}])
            expected_ids += observation
            expected_mask += [0] * len(observation)
            expected_rewards += [0.0] * len(observation)
    assert out.response_ids[0] == expected_ids
    assert out.loss_masks[0] == expected_mask
    assert out.rewards[0] == pytest.approx(expected_rewards)
    # Token in, token out, and still what a full re-render of the conversation gives: no drift.
    conversation = list(question("M1"))
    for turn, reply in enumerate(replies):
        conversation.append({"role": "assistant", "content": reply})
        if turn < 2:
            conversation.append({"role": "user", "content": feedback[turn]})
    full = encode(tokenizer, render(tokenizer, conversation, add_generation_prompt=False))
    assert out.prompt_token_ids[0] + out.response_ids[0] == full[:-1]  # all but the "\n" after the last turn
    # Each turn's engine input was exactly the sequence so far.
    assert [len(r.prompt_ids) for r in engine.requests] == [
        len(out.prompt_token_ids[0]) + start for start in _turn_starts(out.loss_masks[0])
    ]
    assert out.metrics["generate/num_turns/mean"] == 3
    assert out.metrics["environment/gsm8k_multi_turn/avg_steps"] == 3


def _turn_starts(mask: list[int]) -> list[int]:
    return [i for i, m in enumerate(mask) if m == 1 and (i == 0 or mask[i - 1] == 0)]


def test_max_turns_is_passed_to_the_env_and_enforced(tokenizer: PreTrainedTokenizerBase, probe_log: Any) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({"P1": ["again"]}))
    steps = [{"reward": 0.5, "done": False, "observations": [{"role": "user", "content": "more"}]}]
    batch = make_batch([("P1", "test_probe", {"tag": "p", "steps": steps})])
    out = generate(engine, tokenizer, batch, max_turns=3, env_configs={"test_probe": {"k": 1}})
    assert out.stop_reasons == ["max_turns"]
    assert out.env_metrics == [{"steps": 3, "max_turns_seen": 3, "config": {"k": 1}}]
    assert len(engine.requests) == 3
    rewarded = [i for i, r in enumerate(out.rewards[0]) if r]
    assert len(rewarded) == 3
    assert all(out.loss_masks[0][i] == 1 for i in rewarded)
    assert out.loss_masks[0][-1] == 1  # no trailing observation
    assert probe_log.tagged("close") == ["p"]


def test_context_limit_stops_before_the_next_turn(tokenizer: PreTrainedTokenizerBase) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({"C1": ["#### 7"]}))
    batch = make_batch([("C1", "gsm8k_multi_turn", gsm8k_extras())])
    prompt_length = len(ChatEncoder(tokenizer).prompt_ids(question("C1")))
    out = generate(engine, tokenizer, batch, max_turns=5, max_input_length=prompt_length + 20)
    assert out.stop_reasons == ["context"]
    assert len(engine.requests) == 1
    assert out.response_ids[0] == [*encode(tokenizer, "#### 7"), tokenizer.eos_token_id]  # the observation is cut
    assert sum(out.rewards[0]) == pytest.approx(0.2 / 5)  # the turn's reward is kept


def test_prompt_longer_than_max_input_length(tokenizer: PreTrainedTokenizerBase) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({"C2": ["#### 22"]}))
    out = generate(engine, tokenizer, make_batch([("C2", "gsm8k", gsm8k_extras())]), max_input_length=5)
    assert out.stop_reasons == ["context"]
    assert out.response_ids == [[]]
    assert engine.requests == []


@pytest.mark.parametrize("batched", [False, True])
def test_length_stop_and_post_processing(tokenizer: PreTrainedTokenizerBase, batched: bool) -> None:
    long_answer = "20 + 2 = 22 and that is the answer\n#### 22"
    engine = ScriptedEngine(tokenizer, by_marker({"L1": [long_answer], "S1": ["#### 22"]}))
    params = SamplingParams(max_tokens=12)
    rows = [("L1", "gsm8k", gsm8k_extras()), ("S1", "gsm8k", gsm8k_extras())]

    plain = generate(engine, tokenizer, make_batch(rows, params), batched=batched)
    assert plain.stop_reasons == ["length", "stop"]
    assert plain.response_ids[0] == encode(tokenizer, long_answer)[:12]
    assert plain.loss_masks[0] == [1] * 12

    engine = ScriptedEngine(tokenizer, by_marker({"L1": ["#### 22 " + long_answer], "S1": ["#### 22"]}))
    config = {"batched": batched, "zero_reward_on_non_stop": True, "apply_overlong_filtering": True}
    filtered = generate(engine, tokenizer, make_batch(rows, params), **config)
    assert filtered.rewards[0] == [0.0] * 12  # correct answer, but truncated
    assert filtered.loss_masks[0] == [0] * 12
    assert filtered.rewards[1][-1] == 1.0
    assert set(filtered.loss_masks[1]) == {1}

    engine = ScriptedEngine(tokenizer, by_marker({"L1": ["#### 22 " + long_answer], "S1": ["#### 22"]}))
    evaluation = generate(engine, tokenizer, make_batch(rows, params, training=False), **config)
    assert evaluation.rewards[0][-1] == 1.0  # evaluation reports the env's reward as it is
    assert set(evaluation.loss_masks[0]) == {1}


def test_response_budget_across_turns(tokenizer: PreTrainedTokenizerBase) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({"R1": ["20 + 2 = 21\n#### 21"]}))
    batch = make_batch([("R1", "gsm8k_multi_turn", gsm8k_extras())])
    out = generate(engine, tokenizer, batch, max_turns=5, max_response_length=60)
    assert out.stop_reasons == ["length"]
    assert len(out.response_ids[0]) <= 60
    assert engine.requests[0].params.max_tokens == 60
    assert all(r.params.max_tokens <= 60 for r in engine.requests)
    assert out.loss_masks[0][-1] == 1


def test_stop_string_gets_a_masked_end_of_turn_only_between_turns(tokenizer: PreTrainedTokenizerBase) -> None:
    replies = ["<answer>24</answer> and more", "<answer>22</answer> trailing"]
    engine = ScriptedEngine(tokenizer, by_marker({"T1": replies}))
    steps = [
        {"reward": 0.0, "done": False, "observations": [{"role": "user", "content": "no"}]},
        {"reward": 1.0, "done": True},
    ]
    params = SamplingParams(max_tokens=64, stop=("</answer>",))
    out = generate(engine, tokenizer, make_batch([("T1", "test_probe", {"steps": steps})], params), max_turns=4)
    assert_aligned(out)
    encoder = ChatEncoder(tokenizer)
    eot = encoder.end_of_turn_token_id
    first = encode(tokenizer, "<answer>24</answer>")
    observation = encoder.observation_ids([{"role": "user", "content": "no"}])
    second = encode(tokenizer, "<answer>22</answer>")
    assert out.response_ids[0] == [*first, eot, *observation, *second]  # nothing appended after the last turn
    assert out.loss_masks[0] == [1] * len(first) + [0] * (1 + len(observation)) + [1] * len(second)
    assert out.rewards[0][-1] == 1.0
    assert out.stop_reasons == ["stop"]


def test_batched_mode_uses_one_engine_call(tokenizer: PreTrainedTokenizerBase) -> None:
    scripts = {"A1": ["#### 22"], "B2": ["#### 21"], "C3": ["no idea"]}
    rows = [(marker, "gsm8k", gsm8k_extras()) for marker in scripts]

    class CountingEngine(ScriptedEngine):
        calls = 0

        async def generate(self, prompts: Any, params: SamplingParams) -> Any:
            type(self).calls += 1
            return await super().generate(prompts, params)

    engine = CountingEngine(tokenizer, by_marker(scripts))
    batched = generate(engine, tokenizer, make_batch(rows), batched=True)
    assert CountingEngine.calls == 1
    assert len(engine.requests) == 3
    single = generate(ScriptedEngine(tokenizer, by_marker(scripts)), tokenizer, make_batch(rows))
    for field in ("prompt_token_ids", "response_ids", "loss_masks", "rewards", "rollout_logprobs", "stop_reasons"):
        assert getattr(batched, field) == getattr(single, field)
    assert [sum(r) for r in batched.rewards] == [1.0, 0.0, 0.0]


def test_batched_mode_skips_prompts_that_do_not_fit(tokenizer: PreTrainedTokenizerBase) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({"A1": ["#### 22"]}))
    rows = [("A1", "gsm8k", gsm8k_extras()), ("long " * 50, "gsm8k", gsm8k_extras())]
    limit = len(ChatEncoder(tokenizer).prompt_ids(question("A1")))
    out = generate(engine, tokenizer, make_batch(rows), batched=True, max_input_length=limit)
    assert out.stop_reasons == ["stop", "context"]
    assert len(engine.requests) == 1
    assert out.response_ids[1] == []


def test_batched_mode_requires_single_turn() -> None:
    with pytest.raises(ValueError, match="single-turn"):
        GeneratorConfig(batched=True, max_turns=2)


def test_logprobs_not_requested(tokenizer: PreTrainedTokenizerBase) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({"A1": ["#### 22"]}))
    out = generate(engine, tokenizer, make_batch([("A1", "gsm8k", gsm8k_extras())], SamplingParams(logprobs=False)))
    assert out.rollout_logprobs is None
    assert out.rewards[0][-1] == 1.0


def test_mismatched_batch_lists_are_rejected(tokenizer: PreTrainedTokenizerBase) -> None:
    batch = make_batch([("A1", "gsm8k", gsm8k_extras())])
    batch.env_classes.append("gsm8k")
    with pytest.raises(ValueError, match="one entry per trajectory"):
        generate(ScriptedEngine(tokenizer, by_marker({})), tokenizer, batch)


def test_empty_batch(tokenizer: PreTrainedTokenizerBase) -> None:
    out = generate(ScriptedEngine(tokenizer, by_marker({})), tokenizer, make_batch([]))
    assert len(out) == 0
    assert out.metrics == {}


def test_metrics_cover_every_stop_reason(tokenizer: PreTrainedTokenizerBase) -> None:
    engine = ScriptedEngine(tokenizer, by_marker({"A1": ["#### 22"]}))
    out = generate(engine, tokenizer, make_batch([("A1", "gsm8k", gsm8k_extras())]))
    reasons = [k for k in out.metrics if k.startswith("generate/stop_reason/")]
    assert len(reasons) == 7
    assert out.metrics["generate/llm_time_s/max"] >= 0
    assert out.metrics["generate/env_time_s/mean"] >= 0
    assert "generate/avg_tokens_zero_reward" not in out.metrics  # no trajectory had zero reward
    assert out.metrics["generate/avg_tokens_nonzero_reward"] == len(out.response_ids[0])


def test_reply_script_helpers(tokenizer: PreTrainedTokenizerBase) -> None:
    respond = by_marker({"X": ["one", Reply("two", eos=False)]}, default="other")
    engine = ScriptedEngine(tokenizer, respond)

    async def run() -> list[Any]:
        prompt = encode(tokenizer, "X")
        first = await engine.generate([prompt], SamplingParams())
        second = await engine.generate([prompt, encode(tokenizer, "Y")], SamplingParams())
        return first + second

    one, two, other = asyncio.run(run())
    assert one.token_ids == [*encode(tokenizer, "one"), tokenizer.eos_token_id]
    assert two.token_ids == encode(tokenizer, "two")
    assert (two.stop_reason, other.token_ids[:-1]) == ("stop", encode(tokenizer, "other"))
