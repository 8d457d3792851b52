"""``skyrl-agent run`` end to end, and the ``swe`` env through skyrl-gym."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import skyrl_agent  # noqa: F401  (registers the "swe" env)
import skyrl_gym
from skyrl_agent.agents.actions import SUBMIT, bash_block
from skyrl_agent.agents.swe_env import SWEEnv
from skyrl_agent.cli import main
from skyrl_agent.llm.scripted import oracle_replies
from skyrl_agent.tasks import load_suite, save_tasks
from skyrl_gym.async_env import aclose, ainit, astep
from skyrl_gym.checker import check_env


def _run(tmp_path: Path, *args: str) -> tuple[dict, list[dict]]:
    out = tmp_path / "out"
    assert main(["run", *args, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    return summary, records


def test_oracle_resolves_every_shipped_task(tmp_path: Path) -> None:
    summary, records = _run(tmp_path, "--model", "scripted:oracle", "--backend", "process", "--concurrency", "4")
    n = len(load_suite())
    assert summary["episodes"] == n == len(records)
    assert summary["outcomes"] == {"resolved": n}
    assert summary["resolved_rate"] == 1.0
    assert summary["wall_s"] > 0
    assert summary["sandbox_s"] > 0
    assert summary["llm_s"] >= 0
    record = records[0]
    assert record["reward"] == 1.0
    assert record["finish_reason"] == "submitted"
    assert record["submission"]
    assert record["messages"][0]["role"] == "system"
    assert record["turns"][0]["token_ids"]
    assert len(record["turns"][0]["logprobs"]) == len(record["turns"][0]["token_ids"])
    assert {span["name"] for span in record["trace"]["spans"]} >= {"sandbox_start", "agent", "llm_call", "grade"}
    assert record["grade"]["status"] == "resolved"


def test_null_policy_resolves_nothing(tmp_path: Path) -> None:
    summary, records = _run(tmp_path, "--model", "scripted:null", "--backend", "process", "--samples", "2")
    assert summary["episodes"] == 2 * len(load_suite())
    assert summary["resolved"] == 0
    assert summary["outcomes"] == {"unresolved": summary["episodes"]}
    assert all(record["reward"] == 0.0 for record in records)
    assert all(record["group_id"] == record["task_id"] for record in records)


def test_bad_model_is_an_error(tmp_path: Path) -> None:
    assert main(["run", "--model", "scripted:nope", "--backend", "process", "--out", str(tmp_path)]) == 2


def _managed() -> list[str]:
    import docker

    containers = docker.from_env().containers.list(all=True, filters={"label": "skyrl.managed"})
    return [c.id for c in containers]


@pytest.mark.docker
@pytest.mark.slow
def test_oracle_on_docker_leaves_nothing(tmp_path: Path) -> None:
    before = set(_managed())
    tasks = tmp_path / "tasks.jsonl"
    save_tasks(load_suite()[:2], tasks)
    summary, _ = _run(tmp_path, "--tasks", str(tasks), "--model", "scripted:oracle", "--backend", "docker",
                      "--concurrency", "2", "--run-id", "skyrl-test-run")  # fmt: skip
    assert summary["outcomes"] == {"resolved": 2}
    assert set(_managed()) - before == set()


# -- SWEEnv ------------------------------------------------------------------------------------------------


def test_swe_env_passes_check_env() -> None:
    assert "swe" in skyrl_gym.registry
    passed = check_env("swe")
    assert {"init", "step", "final_observations", "terminates", "close", "hostile_action[empty]"} <= set(passed)


def _env(**extras: object) -> SWEEnv:
    env = skyrl_gym.make("swe", env_config={"backend": "process"}, extras={"task": load_suite()[0], **extras})
    assert isinstance(env, SWEEnv)
    return env


def test_swe_env_oracle_episode_is_resolved() -> None:
    async def episode() -> tuple[list[dict[str, str]], list[float], dict]:
        env = _env()
        messages, _ = await ainit(env, [])
        rewards, metadata = [], {}
        for reply in oracle_replies(env.task.gold_patch, workdir=".", patch_path=".git/skyrl-gold.patch"):
            out = await astep(env, reply)
            rewards.append(out["reward"])
            metadata = out["metadata"]
        await aclose(env)
        await aclose(env)  # idempotent
        assert env.sandbox is None
        return messages, rewards, metadata

    messages, rewards, metadata = asyncio.run(episode())
    assert [m["role"] for m in messages] == ["system", "user"]
    assert load_suite()[0].problem_statement.strip()[:40] in messages[1]["content"]
    assert "str_replace_editor" in messages[0]["content"]
    assert rewards == [0.0, 0.0, 1.0]
    assert metadata["resolved"] is True
    assert metadata["outcome"] == "resolved"
    assert metadata["tests"]
    assert all(metadata["fail_to_pass"].values())


def test_swe_env_malformed_action_and_turn_limit() -> None:
    async def episode() -> list[dict]:
        env = _env(max_turns=3)
        await ainit(env, [])
        outs = [await astep(env, "I think I should look around."), await astep(env, bash_block("ls"))]
        outs.append(await astep(env, "```bash\nls\n```\n```bash\npwd\n```"))
        await aclose(env)
        return outs

    bad, ls, last = asyncio.run(episode())
    assert not bad["done"]
    assert "exactly one" in bad["observations"][0]["content"]
    assert not ls["done"]
    assert "exit code 0" in ls["observations"][0]["content"]
    assert last["done"]
    assert last["observations"] == []
    assert last["reward"] == 0.0
    assert last["metadata"]["finish_reason"] == "max_turns"
    assert last["metadata"]["resolved"] is False
    assert last["metadata"]["outcome"] == "unresolved"


def test_swe_env_null_submit_is_graded_unresolved() -> None:
    env = _env()
    env.init([])
    out = env.step(bash_block(SUBMIT))
    env.close()
    env.close()
    assert out["done"]
    assert out["reward"] == 0.0
    assert out["metadata"]["submission"] == ""
    assert env.get_metrics() == {"resolved": 0.0, "turns": 1}


def test_swe_env_needs_a_task() -> None:
    with pytest.raises(ValueError, match="task"):
        SWEEnv(env_config={"backend": "process"})


def test_latency_oracle_episodes_share_one_modelled_gpu() -> None:
    from skyrl_agent.dispatch import Episode
    from skyrl_agent.run import make_llm

    factory = make_llm("scripted:latency-oracle")
    tasks = load_suite()[:2]
    clients = [factory(Episode(id=task.id, data={"task": task})) for task in tasks]
    assert clients[0].gpu is clients[1].gpu
    # The seed depends on the episode id only, not on the process's string hashing.
    again = factory(Episode(id=tasks[0].id, data={"task": tasks[0]}))
    assert clients[0]._rng.random() == again._rng.random()
