"""SWE training from a skyrl-train run config: the ``generator.factory`` function, and the prompt rows it reads.

::

    skyrl-agent tasks export-dataset data/swe/train.jsonl          # one row per task of the shipped suite
    skyrl-train --config skyrl-train/examples/swe_react.yaml       # generator.factory names swe_generator

:func:`swe_generator` builds an :class:`~skyrl_agent.integrations.skyrl_train.AgentGenerator` over the run's
engine: the ReAct agent runs each episode in a sandbox of ``backend`` (Docker by default), through the
dispatcher, and the hidden tests grade it. Its sandboxes carry the label ``skyrl.run=<run_id>``: the Docker
backend's reaper removes them at exit and on SIGTERM/SIGINT, and :meth:`SWETrainGenerator.close` (which the run
calls at its end) removes whatever is still open. Its keywords, ``generator.factory_kwargs``, are the fields of
:class:`~skyrl_agent.integrations.swe_config.SWEGeneratorConfig`; :func:`agent_config` and :func:`dispatcher_config`
turn them, over the run's generator settings, into the generator's and the dispatcher's configs.

:func:`dataset_rows` turns tasks into rows of skyrl-train's prompt datasets: ``env_class`` ``swe``, the task's
``task_id`` (and ``tasks_path`` when the tasks are not the shipped suite) as env extras, and the episode's opening
messages as ``prompt`` (the generator renders its own from the task; the column is what ``data.max_prompt_length``
filters on and what sample logs show).

skyrl-train is imported only when :func:`swe_generator` runs, so this module imports without torch.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl_agent.agents.swe_env import instructions
from skyrl_agent.dispatch import DispatcherConfig, StageLimits, Timeouts
from skyrl_agent.dispatch.outcomes import FailurePolicy
from skyrl_agent.harness.base import Harness
from skyrl_agent.integrations.harness import HarnessGenerator
from skyrl_agent.integrations.skyrl_train import AgentGenerator, AgentGeneratorConfig
from skyrl_agent.integrations.swe_config import BackendName, SWEGeneratorConfig
from skyrl_agent.pipeline import SWEPipeline
from skyrl_agent.sandbox.base import SandboxBackend
from skyrl_agent.sandbox.group_fork import group_of
from skyrl_agent.tasks.format import SWETask

if TYPE_CHECKING:
    from skyrl_agent.sandbox.ray_hosts import RayHostSettings
    from skyrl_train.generators.base import GeneratorInput
    from skyrl_train.generators.factory import GeneratorContext
    from skyrl_train.generators.skyrl_gym_generator import GeneratorConfig

__all__ = [
    "ENV_CLASS",
    "RUN_LABEL",
    "BackendName",
    "SWEGeneratorConfig",
    "SWEHarnessTrainGenerator",
    "SWETrainGenerator",
    "agent_config",
    "build_swe_generator",
    "dataset_rows",
    "dispatcher_config",
    "export_dataset",
    "swe_generator",
]

ENV_CLASS = "swe"  # the env class of every row (AgentGenerator runs only these)
RUN_LABEL = "skyrl.run"  # the sandbox label naming the run (docker ps -a --filter label=skyrl.run=<run_id>)


class SWETrainGenerator(AgentGenerator):
    """An :class:`AgentGenerator` that owns its sandbox backend: :meth:`close` closes it.

    Attributes:
        run_id: The ``skyrl.run`` label on every sandbox of this generator.
        group_fork: The samples of one prompt start from one prepared sandbox (:attr:`SWEPipeline.group_fork`).
    """

    def __init__(self, *args: Any, run_id: str, group_fork: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_id, self.group_fork = run_id, group_fork

    def _pipeline(self, batch: GeneratorInput) -> SWEPipeline:
        """The batch's pipeline, told whether to fork groups and how many samples each group has."""
        return _grouped(super()._pipeline(batch), batch, group_fork=self.group_fork)

    async def close(self) -> None:
        """Remove every sandbox (and snapshot) still open, and release the backend; the engine is left alone."""
        await self.backend.close()


class SWEHarnessTrainGenerator(HarnessGenerator):
    """A :class:`HarnessGenerator` that owns its sandbox backend and gateway: :meth:`close` ends both.

    Attributes:
        group_fork: The samples of one prompt start from one prepared sandbox (:attr:`SWEPipeline.group_fork`).
    """

    def __init__(self, *args: Any, run_id: str, group_fork: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_id, self.group_fork = run_id, group_fork

    def _pipeline(self, batch: GeneratorInput) -> SWEPipeline:
        """The batch's pipeline, told whether to fork groups and how many samples each group has."""
        return _grouped(super()._pipeline(batch), batch, group_fork=self.group_fork)

    async def close(self) -> None:
        """Stop the gateway, remove every sandbox still open and release the backend; the engine is left alone."""
        try:
            await super().close()
        finally:
            await self.backend.close()


def _grouped(pipeline: SWEPipeline, batch: GeneratorInput, *, group_fork: bool) -> SWEPipeline:
    """``pipeline`` with group forks on or off, and the number of samples of each of the batch's groups."""
    sizes = Counter(group_of(tid) for tid in batch.trajectory_ids)
    return replace(pipeline, group_fork=group_fork, group_sizes=sizes)


def swe_generator(context: GeneratorContext, **kwargs: Any) -> AgentGenerator:
    """The run's generator: SWE episodes of the ReAct agent in sandboxes (``generator.factory``).

    Every keyword is a key of ``generator.factory_kwargs``: a field of :class:`SWEGeneratorConfig`, whose comments
    say what each sets. The run's config validation builds that dataclass from the same mapping first (this
    function's ``settings_type``), so a bad key fails before any model loads.

    Args:
        context: The run's engine, tokenizer and generator settings (skyrl-train passes it).
        **kwargs: The fields of :class:`SWEGeneratorConfig` to set.

    Raises:
        ValueError: A key is unknown, a value has the wrong type or a limit is not positive (a
            ``skyrl_train.generators.factory.FactoryError`` naming every such key), ``backend`` is not available
            here, or ``harness`` is unknown or not installed.
    """
    from skyrl_train.generators.factory import build_settings

    return build_swe_generator(context, build_settings(SWEGeneratorConfig, kwargs))


# What skyrl_train.generators.factory.check_factory builds from generator.factory_kwargs at config validation.
swe_generator.settings_type = SWEGeneratorConfig  # type: ignore[attr-defined]  # a function attribute


def build_swe_generator(context: GeneratorContext, settings: SWEGeneratorConfig) -> AgentGenerator:
    """:func:`swe_generator` with its settings already built: the generator of ``settings.harness`` or the ReAct one.

    Raises:
        ValueError: ``settings.backend`` is not available here, or ``settings.harness`` is unknown or not installed.
    """
    from skyrl_train.generators.chat import ChatEncoder

    run_id = settings.run_id or _default_run_id(context.run_name)
    config = agent_config(settings, context.config, seed=context.seed, run_id=run_id)
    chat = ChatEncoder(context.tokenizer, chat_template_kwargs=context.config.chat_template_kwargs)
    harness = settings.harness
    program = None if harness is None else _harness(harness)  # refuse an unknown one before starting sandboxes
    lifetime_s = config.dispatcher.timeouts.sandbox_lifetime_s
    sandboxes = make_backend(
        settings.backend, run_id, lifetime_s=lifetime_s, reaper=settings.reaper, hosts=settings.ray_hosts()
    )
    if program is None:
        return SWETrainGenerator(
            sandboxes, chat, engine=context.engine, config=config, run_id=run_id, group_fork=settings.group_fork
        )
    return SWEHarnessTrainGenerator(
        sandboxes, chat, engine=context.engine, tokenizer=context.tokenizer, harness=program, config=config,
        command_timeout_s=settings.command_timeout_s, run_id=run_id, group_fork=settings.group_fork,
    )  # fmt: skip


def agent_config(settings: SWEGeneratorConfig, run: GeneratorConfig, *, seed: int, run_id: str) -> AgentGeneratorConfig:
    """The :class:`AgentGeneratorConfig` of ``settings``; a ``None`` field takes the run's generator setting."""
    env_options: dict[str, Any] = {"command_timeout_s": settings.command_timeout_s}
    if settings.tasks_path is not None:
        env_options["tasks_path"] = settings.tasks_path
    return AgentGeneratorConfig(
        max_turns=settings.max_turns or run.max_turns,
        max_input_length=settings.max_input_length or run.max_input_length,
        dispatcher=dispatcher_config(settings, run, seed=seed),
        env_options=env_options,
        labels={RUN_LABEL: run_id},
        admission=settings.admission_config(),
    )


def dispatcher_config(settings: SWEGeneratorConfig, run: GeneratorConfig, *, seed: int) -> DispatcherConfig:
    """The dispatcher's limits, deadlines and failure policy of ``settings`` (``None`` fields: the run's)."""
    episode_s = settings.episode_timeout_s if settings.episode_timeout_s is not None else run.timeout_s
    timeouts = Timeouts(
        episode_s=episode_s,
        llm_call_s=settings.llm_call_timeout_s,
        tool_call_s=settings.tool_call_timeout_s,
        sandbox_start_s=settings.sandbox_start_timeout_s,
        grade_s=settings.grade_timeout_s,
    )
    runs = settings.max_concurrent_episodes or run.max_concurrent_trajectories or StageLimits().run
    limits = StageLimits(acquire=settings.max_concurrent_starts, run=runs, grade=settings.max_concurrent_grades)
    policy = FailurePolicy(max_episode_attempts=settings.max_episode_attempts)
    return DispatcherConfig(limits=limits, timeouts=timeouts, policy=policy, seed=seed)


def _harness(name: str) -> Harness:
    from skyrl_agent.integrations.serving import make_harness

    try:
        return make_harness(name)
    except ValueError as exc:
        raise ValueError(f"generator.factory_kwargs.harness: {exc}") from exc


def make_backend(
    name: str,
    run_id: str,
    *,
    lifetime_s: float | None = None,
    reaper: bool = True,
    hosts: RayHostSettings | None = None,
) -> SandboxBackend:
    """The sandbox backend ``name`` for run ``run_id``; a Docker one removes sandboxes unclosed after ``lifetime_s``.

    ``hosts`` says where a ``ray`` backend places its sandboxes.

    Raises:
        ValueError: ``name`` is unknown, or its backend cannot run here (the message says what is missing).
    """
    from skyrl_agent.tasks.validate import make_backend as make_named_backend

    if name == "docker" and reaper:
        from skyrl_agent.sandbox import reaper as reaping

        _install_reaper(reaping, run_id)
    try:
        return make_named_backend(name, run_id=run_id, lifetime_s=lifetime_s, hosts=hosts)
    except ValueError as exc:
        raise ValueError(f"generator.factory_kwargs.backend: {exc}") from exc


def _install_reaper(reaping: Any, run_id: str) -> None:
    """Reap dead runs now; this run's at exit and on signals where Python allows handlers (the main thread).

    Off the main thread only dead runs are reaped: :meth:`SWETrainGenerator.close` and the backend's lease (which
    lets a later reaper take what a killed run left) cover this run.
    """
    if threading.current_thread() is threading.main_thread():
        reaping.install_reaper(run_id)
    else:
        reaping.reap(dead_only=True)


def _default_run_id(run_name: str) -> str:
    from skyrl_agent.sandbox.reaper import default_run_id

    return f"{run_name}-{default_run_id()}" if run_name else default_run_id()


def dataset_rows(
    tasks: Sequence[SWETask], *, tasks_path: str | Path | None = None, max_turns: int = 30
) -> list[dict[str, Any]]:
    """One prompt row per task (see the module docstring); ``tasks_path`` is recorded in each row when given.

    ``data_source`` is ``swe/<repository name>`` (or ``swe`` for tasks without a local repository), so
    evaluation reports a mean reward per repository.
    """
    path = str(Path(tasks_path).resolve()) if tasks_path is not None else None
    rows = []
    for task in tasks:
        repo = Path(task.repo).name if isinstance(task.repo, Path) else None
        row: dict[str, Any] = {
            "data_source": f"swe/{repo}" if repo else "swe",
            "prompt": instructions(task, max_turns + 1),  # as the pipeline renders it: the env allows one more
            "reward_spec": None,  # the hidden tests grade; there is no ground truth to compare with
            "env_class": ENV_CLASS,
            "task_id": task.id,
        }
        if path is not None:
            row["tasks_path"] = path
        rows.append(row)
    return rows


def export_dataset(out: str | Path, *, tasks_path: str | Path | None = None, max_turns: int = 30) -> int:
    """Write :func:`dataset_rows` of the task file (default the shipped suite) to ``out`` as JSON lines.

    Returns the number of rows. The file is written to a temporary name first, so it is never half written.
    """
    from skyrl_agent.tasks import SUITE_PATH, load_tasks

    tasks = load_tasks(Path(tasks_path) if tasks_path is not None else SUITE_PATH)
    rows = dataset_rows(tasks, tasks_path=tasks_path, max_turns=max_turns)
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(target)
    return len(rows)
