"""``SWEEnv``: one SWE-style task as a skyrl-gym text env, registered as ``swe``.

``init`` acquires a sandbox, writes the task's repository into it (:func:`~skyrl_agent.tasks.prepare_workspace`)
and returns the instructions: a system message with the tool format and a user message with the issue. ``step``
runs one tool call through :class:`~skyrl_agent.agents.tool_env.SandboxToolEnv` (bash, the file editor, submit);
a malformed reply gets a corrective observation. ``submit``, or reaching ``max_turns``, grades the workspace diff
in a fresh sandbox (:func:`~skyrl_agent.tasks.grade`): reward ``1.0`` when resolved, else ``0.0``, with the
verdict in ``metadata``. An action that destroyed the sandbox ends the episode ungraded with reward ``0.0`` and
``metadata["finish_reason"] == "agent_broke_sandbox"`` (the agent's failure; see
:class:`~skyrl_agent.agents.tool_env.SandboxToolEnv`). ``close`` releases the sandbox and is idempotent.

Constructor arguments (skyrl-gym style ``env_config`` and ``extras``; an ``extras`` key wins over ``env_config``):

- ``task``: a :class:`~skyrl_agent.tasks.SWETask` or its JSON row, or ``task_id`` (looked up in ``tasks_path``,
  default: the shipped suite);
- where sandboxes come from: ``sandbox`` (borrowed: never closed), ``pool`` (a
  :class:`~skyrl_agent.sandbox.WarmPool`; the sandbox goes back with ``pool.release``) or ``backend`` (a backend,
  or the name ``docker``, ``local`` or ``process``; default ``docker``); ``grader`` (a backend) grades, by default
  the same backend;
- ``max_turns`` (30), ``command_timeout_s`` (60), ``max_output_chars`` (10000), ``grade`` (true: grade when the
  episode ends; false: only return the diff as ``metadata["submission"]``);
- ``workspace_base``: with a borrowed ``sandbox`` whose workspace is already prepared (a fork of its group's
  prepared sandbox, :mod:`skyrl_agent.sandbox.group_fork`), that workspace's base commit: ``init`` does not
  prepare it again. Grading is unaffected: it always starts a fresh sandbox.

Sandbox calls are async: drive the env with :mod:`skyrl_gym.async_env` (``ainit``/``astep``/``aclose``). The
blocking ``init``/``step``/``close`` work outside an event loop: they run on a loop the env keeps for itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from skyrl_agent.agents.tool_env import SANDBOX_BROKEN, SandboxToolEnv
from skyrl_agent.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from skyrl_agent.tasks.format import SWETask, task_from_dict
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType, EpisodeSample

__all__ = ["SYSTEM_PROMPT", "SWEEnv", "instructions", "task_from_options"]

T = TypeVar("T")

SYSTEM_PROMPT = """You are a software engineer fixing an issue in a Python repository at {workdir}.

Each reply holds your reasoning and then exactly one action:

- a shell command, run with bash in {workdir}:
```bash
python3 -m pytest -q
```
- a file edit with the editor (commands: view, create, str_replace, insert, undo_edit; paths are absolute or \
relative to {workdir}):
```json
{{"tool": "str_replace_editor", "command": "str_replace", "path": "pkg/module.py", "old_str": "...", \
"new_str": "..."}}
```
  `view` takes an optional "view_range": [start, end]; `create` takes "file_text"; `insert` takes "insert_line" \
and "new_str".
- when the fix is complete, submit the repository's changes:
```bash
submit
```

Change the source code, not the tests: hidden tests decide whether the issue is resolved. You have {max_turns} \
turns."""

USER_PROMPT = """Resolve this issue in the repository at {workdir}:

<issue>
{problem}
</issue>"""


def instructions(task: SWETask, max_turns: int) -> list[dict[str, str]]:
    """The system and user messages that start an episode of ``task``."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT.format(workdir=task.workdir, max_turns=max_turns)},
        {"role": "user", "content": USER_PROMPT.format(workdir=task.workdir, problem=task.problem_statement.strip())},
    ]


def task_from_options(options: Mapping[str, Any]) -> SWETask:
    """The task named by env options: ``task`` (an :class:`SWETask` or its JSON row), or ``task_id`` in ``tasks_path``.

    Raises:
        ValueError: No task is named, or ``task_id`` is not in the task file.
    """
    task = options.get("task")
    if isinstance(task, SWETask):
        return task
    if isinstance(task, Mapping):
        return task_from_dict(task, where="extras['task']")
    task_id = options.get("task_id")
    if task_id is None:
        raise ValueError("SWEEnv needs extras['task'] (an SWETask or its JSON row) or extras['task_id']")
    from skyrl_agent.tasks import SUITE_PATH, load_tasks

    for candidate in load_tasks(options.get("tasks_path") or SUITE_PATH):
        if candidate.id == task_id:
            return candidate
    raise ValueError(f"no task {task_id!r} in {options.get('tasks_path') or SUITE_PATH}")


class SWEEnv(BaseTextEnv):
    """One SWE-style task in a sandbox; see the module docstring."""

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        options: dict[str, Any] = {**dict(env_config or {}), **dict(extras or {})}
        self.task = task_from_options(options)
        self.max_turns = int(options.get("max_turns", 30))
        self.command_timeout_s = float(options.get("command_timeout_s", 60.0))
        self.max_output_chars = int(options.get("max_output_chars", 10_000))
        self.grade_on_end = bool(options.get("grade", True))
        self._borrowed: Sandbox | None = options.get("sandbox")
        self._workspace_base: str | None = options.get("workspace_base")
        if self._workspace_base is not None and self._borrowed is None:
            raise ValueError("SWEEnv's workspace_base names the prepared workspace of a borrowed sandbox; give both")
        self._pool: Any = options.get("pool")
        backend = options.get("backend", "docker" if self._borrowed is None and self._pool is None else None)
        self._owns_backend = isinstance(backend, str)
        self._backend_arg: SandboxBackend | str | None = backend
        self._backend: SandboxBackend | None = None if isinstance(backend, str) else backend
        self._grader: SandboxBackend | None = options.get("grader")
        self.sandbox: Sandbox | None = None
        self._tools: SandboxToolEnv | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: asyncio.Task[None] | None = None
        self._closed = False
        self.result: dict[str, Any] | None = None  # the final metadata, once the episode is over

    # -- async API (awaited by skyrl_gym.async_env) --------------------------------------------------------

    async def ainit(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Acquire a sandbox, write the repository into it, and return the instructions (``prompt`` is ignored)."""
        from skyrl_agent.tasks.workspace import prepare_workspace

        self.sandbox = await self._acquire()
        base_commit = self._workspace_base
        if base_commit is None:
            base_commit = await prepare_workspace(self.task, self.sandbox)
        self._tools = SandboxToolEnv(
            self.sandbox,
            workdir=self.task.workdir,
            command_timeout_s=self.command_timeout_s,
            max_output_chars=self.max_output_chars,
            max_turns=self.max_turns + 1,  # this env ends the episode itself (and grades)
            base_commit=base_commit,
        )
        return instructions(self.task, self.max_turns), {"task_id": self.task.id, "sandbox": self.sandbox.id}

    async def astep(self, action: str) -> BaseTextEnvStepOutput:
        """Run one tool call; grade on ``submit`` or at ``max_turns``."""
        if self._tools is None:
            raise RuntimeError("SWEEnv.astep called before ainit")
        if self.result is not None:
            raise RuntimeError("the episode is over; make a new SWEEnv")
        self.turns += 1
        out = await self._tools.astep(action)
        if out["done"] and out["metadata"].get("finish_reason") == SANDBOX_BROKEN:
            # Nothing is left to grade: the episode ends with the reward of a failure.
            self.result = {**out["metadata"], "submission": "", "resolved": False, "task_id": self.task.id}
            return BaseTextEnvStepOutput(
                observations=out["observations"], reward=0.0, done=True, metadata=dict(self.result)
            )
        if out["done"]:
            return await self._finish(str(out["metadata"].get("submission", "")), "submitted")
        if self.turns >= self.max_turns:
            return await self._finish(await self._tools.diff(), "max_turns")
        return out

    async def aclose(self) -> None:
        """Release the sandbox (and a backend this env created); idempotent."""
        if self._closed:
            return
        self._closed = True
        sandbox, self.sandbox = self.sandbox, None
        try:
            if sandbox is not None and sandbox is not self._borrowed:
                if self._pool is not None:
                    await self._pool.release(sandbox)
                else:
                    await sandbox.close()
        finally:
            if self._owns_backend and self._backend is not None:
                await self._backend.close()

    # -- blocking API ---------------------------------------------------------------------------------------

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """:meth:`ainit` on the env's own event loop (outside a running loop only)."""
        return self._run(self.ainit(prompt))

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """:meth:`astep` on the env's own event loop (outside a running loop only)."""
        return self._run(self.astep(action))

    def close(self) -> None:
        """:meth:`aclose`; inside a running loop it is scheduled there (prefer ``await aclose()``)."""
        if self._closed:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and self._loop is None:
            self._closing = running.create_task(self.aclose())
            return
        try:
            self._run(self.aclose())
        finally:
            if self._loop is not None:
                self._loop.close()
                self._loop = None

    def get_metrics(self) -> dict[str, Any]:
        """``resolved`` (1/0) and the turns taken."""
        resolved = bool(self.result and self.result.get("resolved"))
        return {"resolved": float(resolved), "turns": self.turns}

    @classmethod
    def sample_episode(cls) -> EpisodeSample:
        """The first shipped task on the (unisolated, fast) process backend, solved by the oracle's replies."""
        from skyrl_agent.llm.scripted import oracle_replies
        from skyrl_agent.tasks import load_suite

        task = load_suite()[0]
        return EpisodeSample(
            prompt=[],
            extras={"task": task},
            env_config={"backend": "process", "max_turns": 4},
            actions=tuple(oracle_replies(task.gold_patch, workdir=".", patch_path=".git/skyrl-gold.patch")),
        )

    # -- internals ------------------------------------------------------------------------------------------

    def _backend_or_make(self) -> SandboxBackend:
        if self._backend is None:
            if not isinstance(self._backend_arg, str):
                raise ValueError("SWEEnv needs a sandbox, a pool or a backend")
            from skyrl_agent.tasks.validate import make_backend

            self._backend = make_backend(self._backend_arg)
        return self._backend

    async def _acquire(self) -> Sandbox:
        if self._borrowed is not None:
            return self._borrowed
        if self._pool is not None:
            sandbox: Sandbox = await self._pool.acquire()
            return sandbox
        spec = SandboxSpec(image=self.task.base_image, workdir=self.task.workdir)
        return await self._backend_or_make().create(spec)

    async def _finish(self, patch: str, reason: str) -> BaseTextEnvStepOutput:
        metadata: dict[str, Any] = {"submission": patch, "finish_reason": reason, "task_id": self.task.id}
        reward = 0.0
        if self.grade_on_end:
            from skyrl_agent.tasks.grading import grade

            grader = self._grader or (self._pool.backend if self._pool is not None else self._backend_or_make())
            verdict = await grade(self.task, patch, grader)
            reward = 1.0 if verdict.resolved else 0.0
            metadata.update(
                resolved=verdict.resolved,
                outcome=verdict.status,
                tests=dict(verdict.tests),
                fail_to_pass=dict(verdict.fail_to_pass),
                pass_to_pass=dict(verdict.pass_to_pass),
                error=verdict.error,
            )
        self.result = metadata
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata=metadata)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise TypeError("SWEEnv is async inside an event loop; use skyrl_gym.async_env.ainit/astep/aclose")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)
