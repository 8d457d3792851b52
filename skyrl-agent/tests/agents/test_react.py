from __future__ import annotations

import asyncio
from typing import Any

import pytest

from skyrl_agent.agents import (
    AgentConfig,
    BashAction,
    EditorAction,
    FormatError,
    ReActAgent,
    SandboxToolEnv,
    SubmitAction,
    parse_action,
)
from skyrl_agent.agents.actions import bash_block, editor_block
from skyrl_agent.dispatch import RunContext, Trace
from skyrl_agent.llm.scripted import null_policy, oracle_policy
from skyrl_agent.tasks.workspace import DIFF_PATH
from skyrl_agent.testing import CountingEnv, FakeSandbox, ScriptedClient

PROMPT = [{"role": "user", "content": "fix the bug"}]


def test_parse_actions() -> None:
    assert parse_action("let me look\n```bash\nls -la\n```") == BashAction("ls -la")
    assert parse_action("```bash\nsubmit\n```") == SubmitAction()
    edit = parse_action(editor_block("view", "/a.py", view_range=[1, 3]))
    assert edit == EditorAction("view", "/a.py", view_range=(1, 3))
    for bad in ["no action", bash_block("a") + bash_block("b"), "```json\n{oops\n```", editor_block("delete", "/a")]:
        with pytest.raises(FormatError):
            parse_action(bad)


def test_malformed_reply_gets_corrective_observation() -> None:
    env = CountingEnv()
    llm = ScriptedClient(["I forgot the block", bash_block("ls"), bash_block("submit")])
    traj = asyncio.run(ReActAgent(llm, env).run(PROMPT))
    assert traj.finish_reason == "submitted"
    assert traj.turns[0].action is None
    assert "exactly one" in traj.turns[0].observations[0]["content"]
    assert env.actions == [bash_block("ls"), bash_block("submit")]  # the malformed reply never reached the env
    assert traj.reward == 1.0
    assert all(t.completion.token_ids and t.completion.logprobs for t in traj.turns)


def test_context_budget_truncates() -> None:
    llm = ScriptedClient([bash_block("echo " + "x" * 200)])
    traj = asyncio.run(ReActAgent(llm, CountingEnv(), AgentConfig(context_budget_tokens=300)).run(PROMPT))
    assert traj.finish_reason == "context_budget"
    assert traj.truncated


def test_max_turns_truncates_and_saves_every_step() -> None:
    saved: list[int] = []
    llm = ScriptedClient([bash_block("ls")])
    agent = ReActAgent(llm, CountingEnv(), AgentConfig(max_turns=3), on_step=lambda t: saved.append(len(t.turns)))
    traj = asyncio.run(agent.run(PROMPT))
    assert traj.finish_reason == "max_turns"
    assert traj.truncated
    assert saved == [1, 2, 3, 3]


def test_spans_for_llm_and_tool_calls() -> None:
    ctx = RunContext(trace=Trace("e"))
    asyncio.run(ReActAgent(ScriptedClient([bash_block("ls"), bash_block("submit")]), CountingEnv()).run(PROMPT, ctx))
    assert len(ctx.trace.named("llm_call")) == 2
    assert len(ctx.trace.named("tool_call")) == 2


def test_null_policy_submits_nothing() -> None:
    sandbox = FakeSandbox()
    env = SandboxToolEnv(sandbox)
    traj = asyncio.run(ReActAgent(null_policy(), env).run(PROMPT))
    assert traj.finish_reason == "submitted"
    assert len(traj.turns) == 1
    assert "git -c" in sandbox.commands[-1]
    assert " diff --cached " in sandbox.commands[-1]
    assert traj.submission == ""  # no diff file was written: nothing is submitted


def test_oracle_applies_gold_patch_through_tools() -> None:
    patch = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    sandbox = FakeSandbox({DIFF_PATH: patch.encode()})  # where the submission's diff is written
    traj = asyncio.run(ReActAgent(oracle_policy({"gold_patch": patch}), SandboxToolEnv(sandbox)).run(PROMPT))
    assert sandbox.files["/tmp/gold.patch"] == patch.encode()
    assert "git apply /tmp/gold.patch" in sandbox.commands[0]
    assert traj.finish_reason == "submitted"
    assert traj.submission == patch
    with pytest.raises(KeyError):
        oracle_policy({})


def _edit(env: SandboxToolEnv, command: str, path: str, **args: Any) -> str:
    out = asyncio.run(env.astep(editor_block(command, path, **args)))
    return out["observations"][0]["content"]


def test_editor_commands() -> None:
    sandbox = FakeSandbox({"/w/a.py": b"one\ntwo\n"})
    env = SandboxToolEnv(sandbox, workdir="/w")
    assert "2\ttwo" in _edit(env, "view", "/w/a.py")
    assert "Edited" in _edit(env, "str_replace", "/w/a.py", old_str="two", new_str="TWO")
    assert "exactly once" in _edit(env, "str_replace", "/w/a.py", old_str="zzz", new_str="")
    assert "Inserted" in _edit(env, "insert", "/w/a.py", insert_line=0, new_str="zero")
    assert sandbox.files["/w/a.py"] == b"zero\none\nTWO\n"
    _edit(env, "undo_edit", "/w/a.py")
    assert sandbox.files["/w/a.py"] == b"one\nTWO\n"
    assert "Created" in _edit(env, "create", "/w/b.py", file_text="x = 1\n")
    assert "does not exist" in _edit(env, "view", "/w/missing.py")
    bad = asyncio.run(env.astep("nothing here"))
    assert not bad["done"]
    assert "exactly one" in bad["observations"][0]["content"]
