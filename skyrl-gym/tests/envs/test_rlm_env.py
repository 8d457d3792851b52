import copy
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from skyrl_gym.checker import check_env, hostile_actions
from skyrl_gym.envs import registry
from skyrl_gym.envs.base_text_env import ConversationType
from skyrl_gym.envs.registration import deregister, make, register
from skyrl_gym.envs.rlm import BaseRLMEnv
from skyrl_gym.envs.rlm.env import (
    extract_repl_blocks,
    find_final_answer,
    find_final_var,
    load_context,
)

PROMPT: ConversationType = [{"role": "user", "content": "What is the sum of the numbers?"}]
NUMBERS_CONTEXT = {"extra_info": {"context_text": json.dumps({"numbers": [3, 4, 5]})}}


class SumRLMEnv(BaseRLMEnv):
    """Rewards the exact answer 12."""

    def _get_reward(self, final_answer: str) -> float:
        return 1.0 if final_answer.strip() == "12" else 0.0


@pytest.fixture
def registered_sum_env() -> Iterator[str]:
    env_id = "rlm_sum_test"
    register(id=env_id, entry_point=SumRLMEnv)
    try:
        yield env_id
    finally:
        deregister(env_id)


def make_env(cls: type[BaseRLMEnv] = BaseRLMEnv, **extras: Any) -> BaseRLMEnv:
    return cls(extras={**NUMBERS_CONTEXT, **extras})


def repl_block(code: str) -> str:
    return f"```repl\n{code}\n```"


# ----------------------------------------------------------------------------------------------------- episodes


def test_scripted_episode_computes_with_the_repl_then_answers() -> None:
    env = make_env(SumRLMEnv)
    _conversation, info = env.init(PROMPT)
    assert info == {}
    first = env.step("Let me look.\n" + repl_block("total = sum(context['numbers'])\nprint(total)"))
    assert not first["done"]
    assert first["reward"] == 0.0
    feedback, instruction = first["observations"]
    assert feedback == {"role": "user", "content": "REPL output:\n12\n"}
    assert instruction["role"] == "user"
    assert "Turn 2 of 10" in instruction["content"]
    assert first["metadata"] == {"turn": 1, "code_executed": True, "timed_out": False}
    final = env.step("The total is known.\nFINAL(12)")
    assert final["done"]
    assert final["observations"] == []
    assert final["reward"] == 1.0
    assert final["metadata"]["final_answer"] == "12"
    assert env.get_metrics() == {"turns_used": 2, "final_value_set": True, "final_answer": "12", "reward": 1.0}
    env.close()


def test_default_reward_is_one_for_a_non_empty_answer() -> None:
    env = make_env()
    env.init(PROMPT)
    assert env.step("FINAL(anything)")["reward"] == 1.0
    empty = make_env()
    empty.init(PROMPT)
    out = empty.step("FINAL(  )")
    assert out["done"]
    assert out["reward"] == 0.0
    assert empty.get_metrics()["final_answer"] == ""


def test_final_var_names_a_variable_defined_in_the_same_reply() -> None:
    env = make_env(SumRLMEnv)
    env.init(PROMPT)
    out = env.step(repl_block("answer = sum(context['numbers'])") + "\nFINAL_VAR(answer)")
    assert out["done"]
    assert out["reward"] == 1.0
    assert env.final_answer == "12"


def test_final_var_with_quotes_and_from_model_code() -> None:
    env = make_env(SumRLMEnv)
    env.init(PROMPT)
    assert not env.step(repl_block("x = 12"))["done"]
    assert env.step("FINAL_VAR('x')")["reward"] == 1.0
    in_code = make_env(SumRLMEnv)
    in_code.init(PROMPT)
    out = in_code.step(repl_block("result = 6 + 6\nFINAL_VAR('result')"))
    assert out["done"]
    assert out["reward"] == 1.0


def test_final_var_of_a_missing_variable_continues_with_a_note() -> None:
    env = make_env()
    env.init(PROMPT)
    out = env.step("FINAL_VAR(nothing_here)")
    assert not out["done"]
    assert "FINAL_VAR(nothing_here) was ignored" in out["observations"][0]["content"]


def test_max_turns_without_answer_gives_zero() -> None:
    env = make_env(max_turns=2)
    env.init(PROMPT)
    first = env.step(repl_block("print('thinking')"))
    assert not first["done"]
    assert "last turn" in first["observations"][-1]["content"]
    second = env.step("still thinking")
    assert second["done"]
    assert second["observations"] == []
    assert second["reward"] == 0.0
    assert env.get_metrics() == {"turns_used": 2, "final_value_set": False, "final_answer": None, "reward": 0.0}


def test_only_the_last_repl_block_runs() -> None:
    env = make_env()
    env.init(PROMPT)
    out = env.step(repl_block("print('first')") + "\nand then\n" + repl_block("print('second')"))
    assert out["observations"][0]["content"] == "REPL output (the last of 2 blocks):\nsecond\n"
    assert env.repl is not None
    assert env.repl.execute("print('first' in dir())").stdout == "False\n"


def test_reply_without_code_or_answer_is_told_the_format() -> None:
    env = make_env()
    env.init(PROMPT)
    out = env.step("I think the answer is 12.")
    assert not out["done"]
    assert out["metadata"]["code_executed"] is False
    assert "No ```repl code block found" in out["observations"][0]["content"]


def test_errors_and_timeouts_are_fed_back() -> None:
    env = make_env(repl_timeout=0.3)
    env.init(PROMPT)
    error = env.step(repl_block("context['missing']"))
    assert "KeyError: 'missing'" in error["observations"][0]["content"]
    timeout = env.step(repl_block("while True: pass"))
    assert timeout["metadata"]["timed_out"] is True
    assert "REPLTimeoutError" in timeout["observations"][0]["content"]


def test_callbacks_from_extras_reach_the_repl() -> None:
    calls: list[tuple[Any, ...]] = []

    def subcall(prompt: str, context: Any = None) -> str:
        calls.append((prompt, context))
        return "7"

    env = make_env(lm_callback=lambda prompts: [f"lm:{p}" for p in prompts], subcall_fn=subcall, depth=1)
    conversation, _ = env.init(PROMPT)
    assert "llm_query(prompt)" in conversation[0]["content"]
    assert "rlm_query(prompt, context=None)" in conversation[0]["content"]
    out = env.step(repl_block("print(llm_query('hi'), rlm_query('sub', context=[1]) + 1)"))
    assert out["observations"][0]["content"] == "REPL output:\nlm:hi 8\n"
    assert calls == [("sub", [1])]
    assert env.depth == 1


def test_lm_callback_alone_gives_rlm_query_as_an_lm_call() -> None:
    env = make_env(lm_callback=lambda prompts: [f"lm:{p}" for p in prompts])
    conversation, _ = env.init(PROMPT)
    system = conversation[0]["content"]
    for helper in ("llm_query(prompt)", "llm_query_batched(prompts)", "rlm_query(prompt", "rlm_query_batched(prompts"):
        assert helper in system, helper
    assert "copy of you" not in system  # no sub-episodes without subcall_fn: the prompt says they ask the LM
    out = env.step(repl_block("print(rlm_query('sub'))\nprint(rlm_query_batched(['a', 'b']))"))
    assert out["observations"][0]["content"] == "REPL output:\nlm:sub\n['lm:a', 'lm:b']\n"


# ----------------------------------------------------------------------------------------------------- init and prompts


def test_init_returns_system_context_and_instruction() -> None:
    env = make_env(max_turns=3)
    prompt = [{"role": "system", "content": "Be brief."}, *PROMPT]
    conversation, _ = env.init(prompt)
    assert [m["role"] for m in conversation] == ["system", "user", "user"]
    system, context_line, instruction = conversation
    assert "```repl" in system["content"]
    assert "FINAL_VAR(variable_name)" in system["content"]
    assert system["content"].endswith("Be brief.")
    assert "llm_query" not in system["content"]
    assert "rlm_query" not in system["content"]
    assert context_line["content"].startswith("Your context is a dict with 1 keys ('numbers')")
    assert "What is the sum of the numbers?" in instruction["content"]
    assert "Turn 1 of 3" in instruction["content"]
    assert env.conversation is conversation
    assert env.query == "What is the sum of the numbers?"


def test_generator_style_conversation_keeps_one_ephemeral_instruction() -> None:
    env = make_env(max_turns=4)
    conversation, _ = env.init(PROMPT)
    system, context_line, first_instruction = conversation
    for turn in range(1, 4):
        assistant = {"role": "assistant", "content": repl_block(f"t{turn} = {turn}\nprint(t{turn})")}
        conversation.append(assistant)
        out = env.step(assistant["content"])
        conversation += out["observations"]
        instructions = [m for m in conversation if m["content"].startswith("Query:")]
        assert instructions == [conversation[-1]], f"turn {turn}: exactly one, current instruction"
        assert f"Turn {turn + 1} of 4" in conversation[-1]["content"]
    assert conversation[:2] == [system, context_line]
    assert first_instruction not in conversation
    assert [m["role"] for m in conversation[2:]] == ["assistant", "user"] * 3 + ["user"]
    conversation.append({"role": "assistant", "content": "FINAL(done)"})
    final = env.step("FINAL(done)")
    conversation += final["observations"]
    assert final["done"]
    assert not any(m["content"].startswith("Query:") for m in conversation)


def test_instruction_copied_by_the_caller_is_still_removed() -> None:
    env = make_env()
    conversation, _ = env.init(PROMPT)
    conversation[2] = copy.deepcopy(conversation[2])
    env.step("no code")
    assert len(conversation) == 2


def test_caller_with_a_separate_list_is_unaffected() -> None:
    env = make_env()
    observations, _ = env.init(PROMPT)
    history = list(observations)
    out = env.step("nothing yet")
    history += out["observations"]
    assert len(history) == 5  # the caller's own list keeps the stale instruction


@pytest.mark.parametrize(
    ("context_text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("  {not json", "  {not json"),
        ("[1, 2]", "[1, 2]"),
        ("plain text", "plain text"),
        (None, ""),
    ],
)
def test_context_text_decoding(context_text: Any, expected: Any) -> None:
    assert load_context({"context_text": context_text}) == expected
    assert BaseRLMEnv(extras={"extra_info": {"context_text": context_text}}).context == expected


def test_missing_context_and_defaults() -> None:
    env = BaseRLMEnv()
    assert env.context == ""
    assert env.max_turns == 10
    assert env.repl_timeout == 180.0
    assert env.lm_callback is None
    assert env.subcall_fn is None
    assert load_context(None) == ""
    assert load_context({"context_text": {"k": [1]}}) == {"k": [1]}


def test_step_before_init_raises() -> None:
    with pytest.raises(RuntimeError, match="before init"):
        BaseRLMEnv().step("FINAL(1)")


def test_close_removes_the_repl_temp_dir_and_is_idempotent() -> None:
    env = make_env()
    env.init(PROMPT)
    assert env.repl is not None
    temp_dir = env.repl.temp_dir
    env.close()
    env.close()
    assert not os.path.exists(temp_dir)


def test_env_config_selects_repl_options() -> None:
    env = BaseRLMEnv(env_config={"repl_allowed_imports": ["math"], "repl_max_output_chars": 5}, extras=NUMBERS_CONTEXT)
    conversation, _ = env.init(PROMPT)
    assert "You may import only these modules: math" in conversation[0]["content"]
    out = env.step(repl_block("import math\nprint(math.factorial(10))"))
    assert out["observations"][0]["content"].startswith("REPL output:\n36288\n... [output truncated: 3 more")
    env.close()


def test_process_isolated_episode() -> None:
    env = SumRLMEnv(env_config={"repl_isolation": "process"}, extras=NUMBERS_CONTEXT)
    env.init(PROMPT)
    assert env.step(repl_block("total = sum(context['numbers'])"))["done"] is False
    out = env.step("FINAL_VAR(total)")
    assert out["done"]
    assert out["reward"] == 1.0
    env.close()


# ----------------------------------------------------------------------------------------------------- hostile input

REPL_HOSTILE = {
    "import": repl_block("import os\nos.system('echo hi')"),
    "system_exit": repl_block("raise SystemExit"),
    "infinite_loop": repl_block("while True: pass"),
    "null_byte": repl_block("x = 1\x00"),
    "delete_context": repl_block("del context\ndel llm_query"),
    "unclosed_block": "```repl\nprint(1)",
    "unclosed_final": "FINAL(the answer is",
    "unclosed_final_var": "FINAL_VAR(",
    "final_var_builtins": "FINAL_VAR(__builtins__)",
    "bad_str": repl_block("class B:\n    def __str__(self):\n        raise ValueError\nb = B()") + "\nFINAL_VAR(b)",
    "huge_output": repl_block("print('z' * 10**6)"),
    "many_openings": "```repl\n" * 20_000,
    "deep_nesting": repl_block("(" * 5000),
}


@pytest.mark.parametrize("action", [*hostile_actions().values(), *REPL_HOSTILE.values()])
def test_hostile_actions_never_raise(action: str) -> None:
    env = make_env(repl_timeout=0.3)
    env.init(PROMPT)
    out = env.step(action)
    assert isinstance(out["done"], bool)
    assert isinstance(out["reward"], float)
    assert all(isinstance(m["content"], str) for m in out["observations"])
    if not out["done"]:
        assert len(out["observations"][0]["content"]) < 25_000
    env.close()


def test_unprintable_final_var_is_ignored_with_a_note() -> None:
    env = make_env()
    env.init(PROMPT)
    out = env.step(REPL_HOSTILE["bad_str"])
    assert not out["done"]
    assert "FINAL_VAR(b) was ignored" in out["observations"][0]["content"]


def test_block_parsing_is_linear_on_pathological_input() -> None:
    started = time.monotonic()
    extract_repl_blocks("```repl\n" * 50_000)
    find_final_answer("FINAL(\n" * 50_000)
    find_final_answer(" \n" * 200_000)
    assert time.monotonic() - started < 2.0


# ----------------------------------------------------------------------------------------------------- parsing


def test_extract_repl_blocks() -> None:
    text = "a\n```repl\nx = 1\n```\n```python\nno\n```\n```repl  \ny = 2\n```\n```replace\nz\n```"
    assert extract_repl_blocks(text) == ["x = 1\n", "y = 2\n"]
    assert extract_repl_blocks("```repl\nprint(1)```") == ["print(1)"]
    assert extract_repl_blocks("no code") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("FINAL(42)", "42"),
        ("Reasoning...\n  FINAL( Paris )  \nThanks", "Paris"),
        ("FINAL(f(x) = 2)", "f(x) = 2"),
        ("FINAL(line one\nline two)", "line one\nline two"),
        ("FINAL(unclosed", None),
        ("The FINAL(42) is inline", None),
        ("FINAL_VAR(x)", None),
        ("nothing", None),
    ],
)
def test_find_final_answer(text: str, expected: str | None) -> None:
    assert find_final_answer(text) == expected


def test_find_final_var() -> None:
    assert find_final_var("text\nFINAL_VAR(answer)\n") == "answer"
    assert find_final_var("FINAL_VAR( 'answer' )") == "answer"
    assert find_final_var("FINAL(answer)") is None


def test_final_inside_a_repl_block_is_not_an_answer() -> None:
    env = make_env()
    env.init(PROMPT)
    out = env.step(repl_block("s = '''\nFINAL(12)\n'''"))
    assert not out["done"]


# ---------------------------------------------------------------------------------------------- registry and checker


def test_base_rlm_env_is_not_registered() -> None:
    for spec in registry.values():
        assert spec.entry_point not in (BaseRLMEnv, "skyrl_gym.envs.rlm.env:BaseRLMEnv")


def test_check_env_on_a_registered_subclass(registered_sum_env: str) -> None:
    passed = check_env(registered_sum_env)
    assert {"construct", "init", "step", "final_observations", "terminates", "close", "context_manager"} <= set(passed)
    assert all(f"hostile_action[{name}]" in passed for name in hostile_actions())


def test_sample_episode_earns_the_reward(registered_sum_env: str) -> None:
    sample = SumRLMEnv.sample_episode()
    env = make(registered_sum_env, extras=sample.extras)
    assert isinstance(env, SumRLMEnv)
    env.init(sample.prompt)
    outputs = [env.step(action) for action in sample.actions]
    assert [out["done"] for out in outputs] == [False, True]
    assert outputs[-1]["reward"] == 1.0
    env.close()


def test_aggregate_metrics_keeps_numeric_values() -> None:
    metrics = [
        {"turns_used": 2, "final_value_set": True, "final_answer": "12", "reward": 1.0},
        {"turns_used": 4, "final_value_set": False, "final_answer": None, "reward": 0.0},
    ]
    assert BaseRLMEnv.aggregate_metrics(metrics) == {"turns_used": 3.0, "final_value_set": 0.5, "reward": 0.5}
