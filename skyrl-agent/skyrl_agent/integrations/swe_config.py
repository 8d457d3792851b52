"""The settings of :func:`~skyrl_agent.integrations.train_factory.swe_generator`: ``generator.factory_kwargs``.

One field per key, typed, with its default; a run config's mapping becomes this dataclass at validation (through
``skyrl_train.generators.factory.check_factory``, which reads ``swe_generator.settings_type``) and again when the
run builds its generator. Times are seconds of the episode's own time: weight syncs (the run pauses the generator
around them) and waits for a slot do not count. A field whose default is ``None`` and whose comment names a
``generator.*`` key takes that run setting; for the ``*_timeout_s`` fields ``None`` means no deadline.

This module imports nothing of skyrl-train.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from skyrl_agent.dispatch import Timeouts
from skyrl_agent.dispatch.admission import AdmissionConfig, AdmissionConfigError

if TYPE_CHECKING:
    from skyrl_agent.sandbox.ray_hosts import RayHostSettings

__all__ = ["BackendName", "SWEGeneratorConfig"]

BackendName = Literal["docker", "local", "process", "ray"]
_DEFAULT_TIMEOUTS = Timeouts()
_DEFAULT_ADMISSION = AdmissionConfig()
_AT_LEAST_ONE = (
    "max_turns",
    "max_input_length",
    "max_concurrent_episodes",
    "max_concurrent_starts",
    "max_concurrent_grades",
    "max_episode_attempts",
    "max_sandboxes_per_host",
)
# The AdmissionConfig field each key sets (its range checks are AdmissionConfig's; errors name the key).
_ADMISSION_KEYS = {
    "enabled": "admission",
    "floor": "admission_floor",
    "interval_s": "admission_interval_s",
    "kv_high_water": "admission_kv_high_water",
    "waiting_high": "admission_waiting_high",
    "starts_per_s": "sandbox_starts_per_s",
    "start_burst": "sandbox_start_burst",
}


@dataclass(frozen=True)
class SWEGeneratorConfig:
    """What ``generator.factory_kwargs`` may set for SWE episodes; the defaults are the keys' defaults.

    Raises:
        ValueError: a count or limit (``max_*``) is below 1, or an admission key is out of range; the message names
            every such key.
    """

    # docker (isolated containers of the task's image), local (bubblewrap over the image's filesystem) or process
    # (host subprocesses: NOT isolated, trusted tasks only), or ray (sandboxes on the Ray nodes that offer the
    # resource sandbox_host, each node running ray_host_backend)
    backend: BackendName = "docker"
    ray_address: str | None = None  # with ray: the cluster to join; None: the run's Ray, RAY_ADDRESS, or a new one
    ray_host_backend: Literal["docker", "local", "process"] = "docker"  # with ray: what each sandbox host runs
    max_sandboxes_per_host: int = 32  # with ray: sandboxes one host holds at once
    tasks_path: str | None = None  # the task file of rows that give a task_id but no tasks_path; None: the suite
    run_id: str | None = None  # the skyrl.run label of the run's sandboxes; None: <run_name>-<host>-<pid>-<random>
    max_turns: int | None = None  # LLM calls per episode at most; None: generator.max_turns
    max_input_length: int | None = None  # tokens of one LLM call's prompt at most; None: generator.max_input_length
    # agent runs at once; None: generator.max_concurrent_trajectories, else StageLimits().run (32)
    max_concurrent_episodes: int | None = None
    max_concurrent_starts: int = 8  # sandbox starts at once
    max_concurrent_grades: int = 8  # gradings at once
    episode_timeout_s: float | None = None  # one attempt's agent run; None: generator.timeout_s (None there: none)
    llm_call_timeout_s: float | None = _DEFAULT_TIMEOUTS.llm_call_s  # one LLM call
    tool_call_timeout_s: float | None = _DEFAULT_TIMEOUTS.tool_call_s  # the host's, over command_timeout_s
    sandbox_start_timeout_s: float | None = _DEFAULT_TIMEOUTS.sandbox_start_s  # one sandbox start
    grade_timeout_s: float | None = _DEFAULT_TIMEOUTS.grade_s  # grading one episode
    command_timeout_s: float = 60.0  # what one shell command of the agent may take inside the sandbox
    max_episode_attempts: int = 2  # runs of an episode whose sandbox failed, the first included
    reaper: bool = True  # with docker: remove dead runs' sandboxes now, this run's at exit and on SIGTERM/SIGINT
    # the samples of one prompt start from one prepared sandbox (its snapshot forked) rather than preparing their own
    # (on a backend that forks: docker, local, process)
    group_fork: bool = True
    # instead of the ReAct agent, this unmodified agent program (e.g. mini-swe-agent) plays each episode, its model
    # calls going through a gateway over the run's engine that records the tokens (integrations.harness)
    harness: str | None = None
    # Admission (skyrl_agent.dispatch.admission): the episodes running at once follow the engines' reported load,
    # between admission_floor and max_concurrent_episodes; false: always max_concurrent_episodes
    admission: bool = _DEFAULT_ADMISSION.enabled
    admission_floor: int = _DEFAULT_ADMISSION.floor  # episodes running at once at least, however loaded the engines
    admission_interval_s: float = _DEFAULT_ADMISSION.interval_s  # wall seconds between two adjustments of the limit
    admission_kv_high_water: float = _DEFAULT_ADMISSION.kv_high_water  # KV-cache use (0..1) that counts as saturated
    admission_waiting_high: int = _DEFAULT_ADMISSION.waiting_high  # more requests waiting than this: saturated
    sandbox_starts_per_s: float | None = _DEFAULT_ADMISSION.starts_per_s  # sandbox creations per second; None: any
    sandbox_start_burst: int = _DEFAULT_ADMISSION.start_burst  # creations at once after an idle spell (with the rate)

    def __post_init__(self) -> None:
        problems = [
            f"generator.factory_kwargs.{name} must be at least 1, got {value}"
            for name in _AT_LEAST_ONE
            if (value := getattr(self, name)) is not None and value < 1
        ]
        try:
            self.admission_config()
        except AdmissionConfigError as exc:
            problems += [f"generator.factory_kwargs.{_ADMISSION_KEYS[f]} {what}" for f, what in exc.problems.items()]
        if problems:
            raise ValueError("; ".join(problems))

    def admission_config(self) -> AdmissionConfig:
        """The generator's admission: the ``admission*`` and ``sandbox_start*`` keys (other fields: the defaults)."""
        return AdmissionConfig(**{field: getattr(self, key) for field, key in _ADMISSION_KEYS.items()})

    def ray_hosts(self) -> RayHostSettings:
        """The sandbox hosts of ``backend: ray``."""
        from skyrl_agent.sandbox.ray_hosts import RayHostSettings

        return RayHostSettings(
            address=self.ray_address, inner=self.ray_host_backend, max_sandboxes=self.max_sandboxes_per_host
        )
