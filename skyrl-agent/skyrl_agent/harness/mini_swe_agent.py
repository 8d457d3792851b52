"""mini-swe-agent, as published on PyPI, as a harness: its ``DefaultAgent`` and text-based litellm model, unchanged.

Install with ``pip install "skyrl-agent[mini-swe-agent]"``. The package is imported only when a harness runs.

What runs is mini-swe-agent's own code and one of its own configs (default: ``swebench_backticks``, its SWE-bench
setup with ```` ```mswea_bash_command ```` blocks): its prompts, its action parser, its observation and
format-error templates, its step loop, its submission rule (an output whose first line is
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``). Two things are ours, both through its public extension points:

- the model is its ``LitellmTextbasedModel`` with ``model_name="openai/<served model>"`` and ``api_base`` set to
  the episode's endpoint (the gateway session, or any OpenAI-compatible server);
- the environment is :class:`SandboxEnvironment`, which satisfies its ``Environment`` protocol by running each
  command in the episode's sandbox, as its own ``DockerEnvironment`` does with ``docker exec``.

Point the same configuration at a plain server (``skyrl-agent run --harness mini-swe-agent --model URL``) and
the requests are the ones sent in training.
"""

from __future__ import annotations

import base64
import os
import platform
import shlex
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skyrl_agent.dispatch.clock import DeadlineExceeded
from skyrl_agent.harness.base import HarnessCancelled, HarnessJob, HarnessResult, SandboxShell
from skyrl_agent.llm.base import LLMError
from skyrl_agent.sandbox.base import SandboxError

__all__ = [
    "APPLY_THOUGHT",
    "DEFAULT_CONFIG",
    "SUBMIT_MARKER",
    "MiniSWEAgent",
    "SandboxEnvironment",
    "load_config",
    "oracle_replies",
]

DEFAULT_CONFIG = "swebench_backticks"
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's submission rule
APPLY_THOUGHT = "THOUGHT: I apply the fix for this issue."  # the scripted oracle's first reply starts so
INSTALL_HINT = 'mini-swe-agent is not installed: pip install "skyrl-agent[mini-swe-agent]"'


def _prepare_imports() -> None:
    """Settings mini-swe-agent and litellm read when imported: no banner, no network for litellm's price table."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")


def load_config(spec: str | Path = DEFAULT_CONFIG) -> dict[str, Any]:
    """One of mini-swe-agent's configs by name (``swebench_backticks``) or a YAML path, as a dict.

    Raises:
        ImportError: mini-swe-agent is not installed (the message says how to install it).
        FileNotFoundError: No such config.
    """
    _prepare_imports()
    try:
        import yaml
        from minisweagent.config import get_config_path
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    loaded = yaml.safe_load(get_config_path(spec).read_text())
    if not isinstance(loaded, dict) or not isinstance(loaded.get("agent"), dict):
        raise ValueError(f"mini-swe-agent config {spec!r} has no 'agent' section")
    return loaded


@dataclass
class SandboxEnvironmentConfig:
    """What mini-swe-agent's templates and trajectory files see of the environment."""

    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    timeout: int = 60

    def model_dump(self, **_: Any) -> dict[str, Any]:
        """The pydantic-style dump mini-swe-agent calls."""
        return asdict(self)


class SandboxEnvironment:
    """mini-swe-agent's ``Environment`` protocol over the episode's sandbox (see :class:`~.base.SandboxShell`).

    Mirrors its ``DockerEnvironment``: output is stdout and stderr together; a failure to run becomes an output
    with ``returncode`` -1 and ``exception_info``; the submission rule raises its ``Submitted``. The end of the
    episode (:class:`~.base.HarnessCancelled`, the episode deadline) and a lost sandbox
    (:class:`~skyrl_agent.sandbox.base.SandboxError`) are raised through, which stops its agent.
    """

    def __init__(self, shell: SandboxShell, *, env: Mapping[str, str] | None = None, timeout: int = 60) -> None:
        self.shell = shell
        self.config = SandboxEnvironmentConfig(cwd=shell.workdir, env=dict(env or {}), timeout=timeout)

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run ``action["command"]``; return ``{"output", "returncode", "exception_info"}``."""
        command = str(action.get("command", ""))
        exports = "".join(f"export {key}={shlex.quote(value)}; " for key, value in self.config.env.items())
        limit = timeout or self.config.timeout
        try:
            result = self.shell.run(exports + command, timeout_s=float(limit), cwd=cwd or None)
        except (HarnessCancelled, SandboxError):
            raise  # the episode is over, or its sandbox is gone: no later command could run either
        except DeadlineExceeded as exc:
            if exc.kind == "episode":
                raise
            output = _failed("", f"An error occurred while executing the command: {exc}", type(exc).__name__)
        except Exception as exc:  # the sandbox failed this command: the agent sees it, as in mini-swe-agent
            output = _failed("", f"An error occurred while executing the command: {exc}", type(exc).__name__)
        else:
            if result.timed_out:
                message = f"An error occurred while executing the command: timed out after {limit} seconds"
                output = _failed(result.output, message, "TimeoutExpired")
            else:
                output = {"output": result.output, "returncode": result.exit_code, "exception_info": ""}
        self._check_finished(output)
        return output

    def _check_finished(self, output: Mapping[str, Any]) -> None:
        from minisweagent.exceptions import Submitted

        lines = str(output.get("output", "")).lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config and the platform, as mini-swe-agent's environments give them."""
        return {**self.config.model_dump(), **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict[str, Any]:
        """The environment's part of mini-swe-agent's trajectory file."""
        kind = f"{type(self).__module__}.{type(self).__name__}"
        return {"info": {"config": {"environment": self.config.model_dump(), "environment_type": kind}}}


def _failed(output: str, message: str, kind: str) -> dict[str, Any]:
    return {"output": output, "returncode": -1, "exception_info": message, "extra": {"exception_type": kind}}


class MiniSWEAgent:
    """The harness: one mini-swe-agent ``DefaultAgent`` per episode.

    Args:
        config: A mini-swe-agent config name or path (its ``agent``, ``model`` and ``environment`` sections).
        model_kwargs: Extra request fields for every model call (e.g. ``{"temperature": 1.0}``), over the
            config's own.
        http_timeout_s: The HTTP timeout of one model call. Generous: a call waits at the gateway while the
            engine is paused for a weight sync.
    """

    name = "mini-swe-agent"

    def __init__(
        self,
        config: str | Path | Mapping[str, Any] = DEFAULT_CONFIG,
        *,
        model_kwargs: Mapping[str, Any] | None = None,
        http_timeout_s: float = 3600.0,
    ) -> None:
        self.config = dict(config) if isinstance(config, Mapping) else load_config(config)
        self.model_kwargs = dict(model_kwargs or {})
        self.http_timeout_s = http_timeout_s

    def __call__(self, job: HarnessJob) -> HarnessResult:
        """Run mini-swe-agent on the job's task until it submits, hits its step limit or fails."""
        _prepare_imports()
        try:
            import litellm
            from minisweagent.agents.default import DefaultAgent
            from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel
        except ImportError as exc:
            raise ImportError(INSTALL_HINT) from exc
        litellm.suppress_debug_info = True  # else every unpriced model name prints litellm's provider list
        model = LitellmTextbasedModel(**self.model_config(job))
        env_section = dict(self.config.get("environment") or {})
        env = SandboxEnvironment(job.shell, env=env_section.get("env"), timeout=int(env_section.get("timeout", 60)))
        agent_config = {**self.config["agent"], "step_limit": job.max_turns, "cost_limit": 0.0, "output_path": None}
        agent = DefaultAgent(model, env, **agent_config)
        try:
            info = agent.run(job.problem_statement)
        except HarnessCancelled:
            raise
        except Exception as exc:
            if type(exc).__name__ == "ContextWindowExceededError":  # the model ran out of context: a limit
                return HarnessResult("ContextWindowExceeded", _plain(agent.messages), agent.n_calls, error=str(exc))
            if type(exc).__module__.startswith("litellm"):  # the model server failed after litellm's retries
                raise LLMError(f"mini-swe-agent's model call failed: {type(exc).__name__}: {exc}") from exc
            raise
        status = str(info.get("exit_status", ""))
        return HarnessResult(status, _plain(agent.messages), agent.n_calls, submitted=status == "Submitted")

    def model_config(self, job: HarnessJob) -> dict[str, Any]:
        """The ``LitellmTextbasedModel`` settings: the config's ``model`` section aimed at the job's endpoint."""
        section = {k: v for k, v in dict(self.config.get("model") or {}).items() if k not in ("model_class",)}
        kwargs = {
            **dict(section.get("model_kwargs") or {}),
            **self.model_kwargs,
            "api_base": job.endpoint.base_url,
            "api_key": job.endpoint.api_key,
            "timeout": self.http_timeout_s,
        }
        return {**section, "model_name": f"openai/{job.endpoint.model}", "model_kwargs": kwargs,
                "cost_tracking": "ignore_errors"}  # fmt: skip


def _plain(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The conversation without mini-swe-agent's bulky per-message extras (raw responses), for the trajectory file."""
    return [{key: value for key, value in message.items() if key != "extra"} for message in messages]


def oracle_replies(gold_patch: str, patch_path: str = ".git/skyrl-gold.patch") -> list[str]:
    """A scripted mini-swe-agent run of a task's gold fix, in its own action format: apply the patch, submit.

    The patch travels base64-encoded in a heredoc, so no character of it can end the action block early, and it is
    written inside ``.git`` (outside the work tree), so it is never part of the diff.
    """
    encoded = "\n".join(textwrap.wrap(base64.b64encode(gold_patch.encode()).decode(), 76))
    apply = (
        f"{APPLY_THOUGHT}\n\n```mswea_bash_command\n"
        f"base64 -d > {patch_path} <<'SKYRL_PATCH'\n{encoded}\nSKYRL_PATCH\ngit apply {patch_path}\n```"
    )
    submit = (
        f"THOUGHT: The fix is applied; I submit it.\n\n```mswea_bash_command\necho {SUBMIT_MARKER} && git diff\n```"
    )
    return [apply, submit]
