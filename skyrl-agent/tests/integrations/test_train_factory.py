"""``skyrl_agent.integrations.train_factory``: the prompt rows, ``export-dataset``, and the ``generator.factory``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from skyrl_agent import cli
from skyrl_agent.agents.actions import SUBMIT, bash_block
from skyrl_agent.agents.swe_env import instructions, task_from_options
from skyrl_agent.dispatch.admission import AdmissionConfig
from skyrl_agent.integrations.train_factory import ENV_CLASS, RUN_LABEL, dataset_rows, export_dataset, swe_generator
from skyrl_agent.tasks import SUITE_PATH, load_suite


def test_the_module_imports_and_writes_rows_without_torch_or_skyrl_train(tmp_path: Path) -> None:
    code = f"""
import sys
import uuid
sys.modules["torch"] = None
sys.modules["skyrl_train"] = None  # any import of them now raises
from skyrl_agent.integrations.train_factory import export_dataset, swe_generator
import skyrl_agent.harness.command, skyrl_agent.harness.mini_swe_agent, skyrl_agent.integrations.serving
assert export_dataset({str(tmp_path / "rows.jsonl")!r}) == 21
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rows_name_their_tasks_and_open_as_episodes_do() -> None:
    tasks = load_suite()
    rows = dataset_rows(tasks, max_turns=7)
    assert [row["task_id"] for row in rows] == [task.id for task in tasks]
    for row, task in zip(rows, tasks, strict=True):
        assert row["env_class"] == ENV_CLASS
        assert row["data_source"] == f"swe/{Path(str(task.repo)).name}"
        assert row["prompt"] == instructions(task, 8)  # the env allows one turn more than the agent
        assert "tasks_path" not in row  # the shipped suite is the default
        assert task_from_options(row) == task  # what AgentGenerator resolves from the row's extras


def test_export_dataset_command_writes_rows_skyrl_train_loads(tmp_path: Path) -> None:
    out = tmp_path / "data" / "train.jsonl"
    assert cli.main(["tasks", "export-dataset", str(out), "--tasks", str(SUITE_PATH), "--max-turns", "5"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(load_suite())
    assert {row["tasks_path"] for row in rows} == {str(SUITE_PATH.resolve())}  # an explicit file is recorded
    assert not list(out.parent.glob(".*tmp"))
    dataset = pytest.importorskip("skyrl_train.data.dataset", reason="loading the rows needs skyrl-train")
    records = list(dataset.PromptDataset([out], default_env_class="gsm8k"))
    assert [r.env_class for r in records] == [ENV_CLASS] * len(rows)
    assert [task_from_options(r.extras).id for r in records] == [row["task_id"] for row in rows]
    assert cli.main(["tasks", "export-dataset", str(out), "--max-turns", "0"]) == 2  # a clear error, exit 2


# -- the factory, with skyrl-train ----------------------------------------------------------------------------------


def _context(engine: Any, tokenizer: Any, run_dir: Path, **config: Any) -> Any:
    from skyrl_train.generators import GeneratorConfig, GeneratorContext

    settings = GeneratorConfig(**{"max_turns": 3, "max_input_length": 4096, **config})
    return GeneratorContext(engine, tokenizer, settings, run_dir=run_dir, run_name="swe-test", seed=3)


@pytest.fixture
def tokenizer(tiny_model_dir: Path) -> Any:
    pytest.importorskip("skyrl_train", reason="the factory tests need skyrl-train (pip install ./skyrl-train)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_settings_come_from_the_run_and_kwargs_override_them(tokenizer: Any, tmp_path: Path) -> None:
    from skyrl_train.generators.factory import FactorySettings, check_factory

    context = _context(object(), tokenizer, tmp_path, timeout_s=90.0, max_concurrent_trajectories=5)
    generator = swe_generator(context, backend="process")
    config = generator.config
    assert (config.max_turns, config.max_input_length) == (3, 4096)
    assert config.dispatcher.timeouts.episode_s == 90.0
    assert config.dispatcher.limits.run == 5
    assert config.dispatcher.seed == 3
    assert generator.run_id.startswith("swe-test-")
    assert config.labels == {RUN_LABEL: generator.run_id}
    custom = swe_generator(
        context, backend="process", run_id="r1", max_turns=2, max_input_length=999, episode_timeout_s=5.0,
        tasks_path="tasks.jsonl", max_concurrent_episodes=2, command_timeout_s=7.0,
    )  # fmt: skip
    assert (custom.config.max_turns, custom.config.max_input_length, custom.config.labels) == (
        2,
        999,
        {RUN_LABEL: "r1"},
    )
    assert custom.config.dispatcher.timeouts.episode_s == 5.0
    assert custom.config.dispatcher.limits.run == 2
    assert custom.config.env_options == {"command_timeout_s": 7.0, "tasks_path": "tasks.jsonl"}
    with pytest.raises(ValueError, match=r"factory_kwargs\.max_turns must be at least 1"):
        swe_generator(context, backend="process", max_turns=0)
    with pytest.raises(ValueError, match=r"factory_kwargs\.backend: unknown backend 'podman'"):
        swe_generator(context, backend="podman")  # type: ignore[arg-type]
    unbounded = swe_generator(_context(object(), tokenizer, tmp_path), backend="process")
    assert unbounded.config.dispatcher.timeouts.episode_s is None  # generator.timeout_s None: no deadline, as built in
    path = "skyrl_agent.integrations.train_factory:swe_generator"
    assert check_factory(FactorySettings(path, {"backend": "docker", "max_turns": 4})) == []
    assert check_factory(FactorySettings(path, {"harness": "mini-swe-agent"})) == []
    (problem,) = check_factory(FactorySettings(path, {"max_turn": 4}))
    assert "unexpected keyword argument 'max_turn'" in problem


def test_bad_kwargs_are_named_by_the_run_config_validation(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = pytest.importorskip("skyrl_train.config", reason="config validation is skyrl-train's")
    from skyrl_train.generators.factory import FactorySettings, check_factory

    path = "skyrl_agent.integrations.train_factory:swe_generator"
    bad = {"max_turn": 4, "backend": "podman", "episode_timeout_s": "long", "reaper": 1, "max_concurrent_grades": 0}
    expected = [
        "generator.factory_kwargs.max_turn: unexpected keyword argument 'max_turn'; did you mean 'max_turns'?",
        "generator.factory_kwargs.backend: unknown backend 'podman'; "
        "expected one of 'docker', 'local', 'process', 'ray'",
        "generator.factory_kwargs.episode_timeout_s: expected float | None, got str 'long'",
        "generator.factory_kwargs.reaper: expected bool, got int 1",
    ]
    assert check_factory(FactorySettings(path, bad)) == expected  # every problem, the limit's once types fit
    assert check_factory(FactorySettings(path, {"max_turns": 0, "max_concurrent_grades": 0})) == [
        "generator.factory_kwargs.max_turns must be at least 1, got 0; "
        "generator.factory_kwargs.max_concurrent_grades must be at least 1, got 0"
    ]
    assert check_factory(FactorySettings(path, {"episode_timeout_s": 5, "llm_call_timeout_s": None})) == []
    rows = tmp_path / "rows.jsonl"
    export_dataset(rows)
    overrides = [f"generator.factory_kwargs.{key}={value}" for key, value in bad.items()]
    run = config.load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            f"data.train_data=[{rows}]",
            f"trainer.run_dir={tmp_path / 'run'}",
            f"generator.factory={path}",
            *overrides,
        ],
    )
    with pytest.raises(config.ConfigError) as raised:
        config.validate(run)
    assert all(problem in str(raised.value) for problem in expected)


class _Reporting:
    """An engine seen only through its ``load()`` (the generators here are built, never run)."""

    def __init__(self, load: Any) -> None:
        self.current = load

    def load(self) -> Any:
        return self.current


def _admission(tokenizer: Any, tmp_path: Path, load: Any, **kwargs: Any) -> Any:
    """The admission controller of a generator built from ``kwargs`` over an engine reporting ``load``."""
    from skyrl_train.generators.factory import GeneratorPauseLink

    engine = GeneratorPauseLink(_Reporting(load))  # type: ignore[arg-type]  # what a run gives the factory
    context = _context(engine, tokenizer, tmp_path, max_concurrent_trajectories=8)
    return swe_generator(context, backend="process", **kwargs).admission


def test_admission_keys_set_the_generators_controller(tokenizer: Any, tmp_path: Path) -> None:
    from skyrl_train.inference.base import EngineLoad

    warm, queued = EngineLoad(2, 0, 0.6), EngineLoad(2, 6, None)
    default = _admission(tokenizer, tmp_path, warm)
    assert default.config == AdmissionConfig()  # the keys' defaults are the controller's
    assert default.follows_load
    assert default.starts is None
    assert default.poll(8) == 8  # 0.6 of the cache is headroom under the default high water (0.9)
    assert _admission(tokenizer, tmp_path, queued).poll(8) == 4  # 6 waiting > 4: saturated, halved
    keys = {
        "admission_floor": 6,
        "admission_interval_s": 2.5,
        "admission_kv_high_water": 0.5,
        "admission_waiting_high": 7,
        "sandbox_starts_per_s": 4.0,
        "sandbox_start_burst": 3,
    }
    tuned = _admission(tokenizer, tmp_path, warm, **keys)
    assert tuned.config == AdmissionConfig(
        floor=6, interval_s=2.5, kv_high_water=0.5, waiting_high=7, starts_per_s=4.0, start_burst=3
    )
    assert tuned.poll(8) == 6  # 0.6 ≥ 0.5: saturated; halving would give 4, the floor keeps 6
    assert _admission(tokenizer, tmp_path, queued, **keys).poll(8) == 8  # 6 waiting ≤ 7: steady at the ceiling
    assert (tuned.starts.rate_per_s, tuned.starts.burst) == (4.0, 3)


def test_admission_off_leaves_the_fixed_limit_and_keeps_the_start_rate(tokenizer: Any, tmp_path: Path) -> None:
    from skyrl_train.inference.base import EngineLoad

    full = EngineLoad(8, 20, 1.0)
    assert _admission(tokenizer, tmp_path, full).follows_load
    assert _admission(tokenizer, tmp_path, full, admission=False) is None
    rate_only = _admission(tokenizer, tmp_path, full, admission=False, sandbox_starts_per_s=2.0)
    assert not rate_only.follows_load
    assert rate_only.poll(8) == 8  # however full the engine
    assert rate_only.starts.rate_per_s == 2.0


def test_bad_admission_keys_are_named_at_validation(tokenizer: Any) -> None:
    from skyrl_train.generators.factory import FactorySettings, check_factory

    path = "skyrl_agent.integrations.train_factory:swe_generator"
    bad = {
        "admission_floor": 0,
        "admission_interval_s": 0.0,
        "admission_kv_high_water": 1.5,
        "admission_waiting_high": -1,
        "sandbox_starts_per_s": 0.0,
        "sandbox_start_burst": 0,
    }
    assert check_factory(FactorySettings(path, bad)) == [
        "generator.factory_kwargs.admission_floor must be at least 1 (got 0); "
        "generator.factory_kwargs.admission_interval_s must be positive (got 0.0); "
        "generator.factory_kwargs.admission_kv_high_water must be in (0, 1] (got 1.5); "
        "generator.factory_kwargs.admission_waiting_high must be at least 0 (got -1); "
        "generator.factory_kwargs.sandbox_starts_per_s must be positive or None (got 0.0); "
        "generator.factory_kwargs.sandbox_start_burst must be at least 1 (got 0)"
    ]
    assert check_factory(FactorySettings(path, {"admission": "yes"})) == [
        "generator.factory_kwargs.admission: expected bool, got str 'yes'"
    ]
    assert check_factory(FactorySettings(path, {"admission": False, "sandbox_starts_per_s": None})) == []


def _episode(tokenizer: Any, tmp_path: Path, *, link_generator: bool) -> dict[str, Any]:
    """One episode of a dataset row, with a 2 s weight sync while its first LLM call waits; its env metrics.

    The deadline of the episode is 1 s of its own time.
    """
    from skyrl_train.data.dataset import PromptDataset
    from skyrl_train.generators import GeneratorInput
    from skyrl_train.generators.factory import GeneratorPauseLink
    from skyrl_train.generators.testing import ScriptedEngine
    from skyrl_train.inference.base import SamplingParams

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(dataset_rows(load_suite()[:1])[0]) + "\n")
    (record,) = PromptDataset([rows], default_env_class="gsm8k")
    link = GeneratorPauseLink(ScriptedEngine(tokenizer, lambda request: bash_block(SUBMIT)))
    generator = swe_generator(_context(link, tokenizer, tmp_path), backend="process", episode_timeout_s=1.0)
    if link_generator:
        link.attach(generator)  # what a run does with the generator its factory built
    batch = GeneratorInput(
        prompts=[record.messages],
        env_classes=[record.env_class],
        env_extras=[record.extras],
        trajectory_ids=[f"{record.uid}:0"],
        sampling_params=SamplingParams(max_tokens=64),
    )

    async def main() -> dict[str, Any]:
        await link.pause()  # a weight sync: the trainer pauses the engine it was given
        running = asyncio.create_task(generator.generate(batch))
        await asyncio.sleep(2.0)
        await link.resume()
        output = await running
        await generator.close()
        return dict(output.env_metrics[0])

    return asyncio.run(main())


def test_a_weight_sync_does_not_count_against_the_episode_deadline(tokenizer: Any, tmp_path: Path) -> None:
    metrics = _episode(tokenizer, tmp_path, link_generator=True)
    assert (metrics["outcome"], metrics["turns"]) == ("unresolved", 1)  # submitted nothing, graded, not timed out
    # Without the link the engine still pauses, but the episode's clock runs on through the sync.
    assert _episode(tokenizer, tmp_path, link_generator=False)["outcome"] == "timed_out"


def _labelled(run_id: str) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        found = client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"})
        return [container.name for container in found]
    finally:
        client.close()


@pytest.mark.docker
def test_close_removes_the_sandboxes_still_open(tokenizer: Any, tmp_path: Path) -> None:
    from skyrl_agent.sandbox import reaper
    from skyrl_agent.sandbox.base import SandboxSpec

    run_id = f"swe-close-test-{uuid.uuid4().hex[:8]}"
    generator = swe_generator(_context(object(), tokenizer, tmp_path), run_id=run_id, reaper=False)

    async def main() -> list[str]:
        await generator.backend.create(SandboxSpec())  # e.g. an episode's, when the run stops mid-step
        alive = _labelled(run_id)
        await generator.close()
        return alive

    try:
        assert len(asyncio.run(main())) == 1  # the backend labels what it starts with the run id
        assert _labelled(run_id) == []
    finally:
        reaper.reap(run_id, dead_only=False)


def test_the_harness_key_builds_a_harness_generator(tokenizer: Any, tmp_path: Path) -> None:
    from skyrl_agent.harness.command import CommandHarness
    from skyrl_agent.integrations.harness import HarnessGenerator

    context = _context(object(), tokenizer, tmp_path)
    generator = swe_generator(context, backend="process", harness="command:python agent.py", command_timeout_s=7.0)
    assert isinstance(generator, HarnessGenerator)
    assert isinstance(generator.harness, CommandHarness)
    assert list(generator.harness.argv) == ["python", "agent.py"]
    assert generator.command_timeout_s == 7.0
    assert generator.config.max_turns == 3  # the run's generator.max_turns: the harness's step limit
    assert not isinstance(swe_generator(context, backend="process"), HarnessGenerator)
    with pytest.raises(ValueError, match=r"factory_kwargs\.harness: unknown harness 'nope'"):
        swe_generator(context, backend="process", harness="nope")
