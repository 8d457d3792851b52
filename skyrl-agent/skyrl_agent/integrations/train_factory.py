"""SWE training from a skyrl-train run config: the ``generator.factory`` function, and the prompt rows it reads.

::

    skyrl-agent tasks export-dataset data/swe/train.jsonl          # one row per task of the shipped suite
    skyrl-train --config skyrl-train/examples/swe_react.yaml       # generator.factory names swe_generator

:func:`swe_generator` builds an :class:`~skyrl_agent.integrations.skyrl_train.AgentGenerator` over the run's
engine: the ReAct agent runs each episode in a sandbox of ``backend`` (Docker by default), through the
dispatcher, and the hidden tests grade it. Its sandboxes carry the label ``skyrl.run=<run_id>``: the Docker
backend's reaper removes them at exit and on SIGTERM/SIGINT, and :meth:`SWETrainGenerator.close` (which the run
calls at its end) removes whatever is still open.

:func:`dataset_rows` turns tasks into rows of skyrl-train's prompt datasets: ``env_class`` ``swe``, the task's
``task_id`` (and ``tasks_path`` when the tasks are not the shipped suite) as env extras, and the episode's opening
messages as ``prompt`` (the generator renders its own from the task; the column is what ``data.max_prompt_length``
filters on and what sample logs show).

skyrl-train is imported only when :func:`swe_generator` runs, so this module imports without torch.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from skyrl_agent.agents.swe_env import instructions
from skyrl_agent.dispatch import DispatcherConfig, StageLimits, Timeouts
from skyrl_agent.dispatch.outcomes import FailurePolicy
from skyrl_agent.harness.base import Harness
from skyrl_agent.integrations.harness import HarnessGenerator
from skyrl_agent.integrations.skyrl_train import AgentGenerator, AgentGeneratorConfig
from skyrl_agent.sandbox.base import SandboxBackend
from skyrl_agent.tasks.format import SWETask

if TYPE_CHECKING:
    from skyrl_train.generators.factory import GeneratorContext

__all__ = [
    "ENV_CLASS",
    "RUN_LABEL",
    "SWEHarnessTrainGenerator",
    "SWETrainGenerator",
    "dataset_rows",
    "export_dataset",
    "swe_generator",
]

ENV_CLASS = "swe"  # the env class of every row (AgentGenerator runs only these)
RUN_LABEL = "skyrl.run"  # the sandbox label naming the run (docker ps -a --filter label=skyrl.run=<run_id>)
BackendName = Literal["docker", "local", "process"]
_DEFAULT_TIMEOUTS = Timeouts()


class SWETrainGenerator(AgentGenerator):
    """An :class:`AgentGenerator` that owns its sandbox backend: :meth:`close` closes it.

    Attributes:
        run_id: The ``skyrl.run`` label on every sandbox of this generator.
    """

    def __init__(self, *args: Any, run_id: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_id = run_id

    async def close(self) -> None:
        """Remove every sandbox (and snapshot) still open, and release the backend; the engine is left alone."""
        await self.backend.close()


class SWEHarnessTrainGenerator(HarnessGenerator):
    """A :class:`HarnessGenerator` that owns its sandbox backend and gateway: :meth:`close` ends both."""

    def __init__(self, *args: Any, run_id: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_id = run_id

    async def close(self) -> None:
        """Stop the gateway, remove every sandbox still open and release the backend; the engine is left alone."""
        try:
            await super().close()
        finally:
            await self.backend.close()


def swe_generator(
    context: GeneratorContext,
    *,
    backend: BackendName = "docker",
    tasks_path: str | None = None,
    run_id: str | None = None,
    max_turns: int | None = None,
    max_input_length: int | None = None,
    max_concurrent_episodes: int | None = None,
    max_concurrent_starts: int = 8,
    max_concurrent_grades: int = 8,
    episode_timeout_s: float | None = None,
    llm_call_timeout_s: float | None = _DEFAULT_TIMEOUTS.llm_call_s,
    tool_call_timeout_s: float | None = _DEFAULT_TIMEOUTS.tool_call_s,
    sandbox_start_timeout_s: float | None = _DEFAULT_TIMEOUTS.sandbox_start_s,
    grade_timeout_s: float | None = _DEFAULT_TIMEOUTS.grade_s,
    command_timeout_s: float = 60.0,
    max_episode_attempts: int = 2,
    reaper: bool = True,
    harness: str | None = None,
) -> AgentGenerator:
    """The run's generator: SWE episodes of the ReAct agent in ``backend`` sandboxes (``generator.factory``).

    Every argument after ``context`` is a key of ``generator.factory_kwargs``. Times are seconds of the episode's
    own time: weight syncs (the run pauses this generator around them) and waits for a slot do not count.

    Args:
        context: The run's engine, tokenizer and generator settings (skyrl-train passes it).
        backend: ``docker`` (isolated containers of the task's image), ``local`` (bubblewrap over the image's
            filesystem) or ``process`` (host subprocesses: NOT isolated, trusted tasks only).
        tasks_path: The task file of rows that give a ``task_id`` but no ``tasks_path``; default the shipped suite.
        run_id: The ``skyrl.run`` label of the run's sandboxes; default ``<run_name>-<host>-<pid>-<random>``.
        max_turns: LLM calls per episode at most; default ``generator.max_turns``.
        max_input_length: Tokens of one LLM call's prompt at most (the agent's context budget); default
            ``generator.max_input_length``.
        max_concurrent_episodes: Agent runs at once; default ``generator.max_concurrent_trajectories``, else 32.
        max_concurrent_starts: Sandbox starts at once.
        max_concurrent_grades: Gradings at once.
        episode_timeout_s: The deadline of one attempt's agent run; default ``generator.timeout_s`` (None: no
            deadline, as for the built-in generator).
        llm_call_timeout_s: The deadline of one LLM call (None: none).
        tool_call_timeout_s: The host's deadline of one tool call, over the sandbox's ``command_timeout_s``.
        sandbox_start_timeout_s: The deadline of one sandbox start.
        grade_timeout_s: The deadline of grading one episode.
        command_timeout_s: What one shell command of the agent may take inside the sandbox.
        max_episode_attempts: Runs of an episode whose sandbox failed, the first included.
        reaper: With ``docker``, remove dead runs' sandboxes now and this run's at exit and on SIGTERM/SIGINT.
        harness: Instead of the ReAct agent, this unmodified agent program (``mini-swe-agent``) plays each
            episode, its model calls going through a gateway over the run's engine that records the tokens
            (:class:`~skyrl_agent.integrations.harness.HarnessGenerator`).

    Raises:
        ValueError: A limit is not positive, ``backend`` is unknown or not available here, or ``harness`` is
            unknown or not installed.
    """
    from skyrl_train.generators.chat import ChatEncoder

    settings = context.config
    for name, value in (
        ("max_turns", max_turns),
        ("max_input_length", max_input_length),
        ("max_concurrent_episodes", max_concurrent_episodes),
        ("max_concurrent_starts", max_concurrent_starts),
        ("max_concurrent_grades", max_concurrent_grades),
        ("max_episode_attempts", max_episode_attempts),
    ):
        if value is not None and value < 1:
            raise ValueError(f"generator.factory_kwargs.{name} must be at least 1, got {value}")
    run_id = run_id or _default_run_id(context.run_name)
    timeouts = Timeouts(
        episode_s=episode_timeout_s if episode_timeout_s is not None else settings.timeout_s,
        llm_call_s=llm_call_timeout_s,
        tool_call_s=tool_call_timeout_s,
        sandbox_start_s=sandbox_start_timeout_s,
        grade_s=grade_timeout_s,
    )
    runs = max_concurrent_episodes or settings.max_concurrent_trajectories or StageLimits().run
    dispatcher = DispatcherConfig(
        limits=StageLimits(acquire=max_concurrent_starts, run=runs, grade=max_concurrent_grades),
        timeouts=timeouts,
        policy=FailurePolicy(max_episode_attempts=max_episode_attempts),
        seed=context.seed,
    )
    env_options: dict[str, Any] = {"command_timeout_s": command_timeout_s}
    if tasks_path is not None:
        env_options["tasks_path"] = tasks_path
    config = AgentGeneratorConfig(
        max_turns=max_turns or settings.max_turns,
        max_input_length=max_input_length or settings.max_input_length,
        dispatcher=dispatcher,
        env_options=env_options,
        labels={RUN_LABEL: run_id},
    )
    chat = ChatEncoder(context.tokenizer, chat_template_kwargs=settings.chat_template_kwargs)
    program = None if harness is None else _harness(harness)  # refuse an unknown one before starting sandboxes
    sandboxes = make_backend(backend, run_id, lifetime_s=timeouts.sandbox_lifetime_s, reaper=reaper)
    if program is None:
        return SWETrainGenerator(sandboxes, chat, engine=context.engine, config=config, run_id=run_id)
    return SWEHarnessTrainGenerator(
        sandboxes, chat, engine=context.engine, tokenizer=context.tokenizer, harness=program, config=config,
        command_timeout_s=command_timeout_s, run_id=run_id,
    )  # fmt: skip


def _harness(name: str) -> Harness:
    from skyrl_agent.integrations.serving import make_harness

    try:
        return make_harness(name)
    except ValueError as exc:
        raise ValueError(f"generator.factory_kwargs.harness: {exc}") from exc


def make_backend(name: str, run_id: str, *, lifetime_s: float | None = None, reaper: bool = True) -> SandboxBackend:
    """The sandbox backend ``name`` for run ``run_id``; a Docker one removes sandboxes unclosed after ``lifetime_s``.

    Raises:
        ValueError: ``name`` is unknown, or its backend cannot run here (the message says what is missing).
    """
    from skyrl_agent.tasks.validate import make_backend as make_named_backend

    if name == "docker" and reaper:
        from skyrl_agent.sandbox import reaper as reaping

        _install_reaper(reaping, run_id)
    try:
        return make_named_backend(name, run_id=run_id, lifetime_s=lifetime_s)
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
