"""Scheduling of agent episodes: stages, deadlines, retries, admission, the failure taxonomy and traces."""

from skyrl_agent.dispatch.admission import AdjustableLimit, AdmissionConfig, AdmissionController
from skyrl_agent.dispatch.clock import Deadline, DeadlineExceeded, PausableClock, within
from skyrl_agent.dispatch.context import GuardedLLM, RunContext, Timeouts
from skyrl_agent.dispatch.dispatcher import (
    Dispatcher,
    DispatcherConfig,
    DispatchResult,
    Episode,
    EpisodeResult,
    GradeResult,
    StageLimits,
    TrajectoryLike,
)
from skyrl_agent.dispatch.outcomes import DEFAULT_POLICY, FailurePolicy, GradingError, Outcome, Treatment
from skyrl_agent.dispatch.retry import Backoff, CircuitBreaker, CircuitOpenError
from skyrl_agent.dispatch.trace import Span, Trace

__all__ = [
    "DEFAULT_POLICY",
    "AdjustableLimit",
    "AdmissionConfig",
    "AdmissionController",
    "Backoff",
    "CircuitBreaker",
    "CircuitOpenError",
    "Deadline",
    "DeadlineExceeded",
    "DispatchResult",
    "Dispatcher",
    "DispatcherConfig",
    "Episode",
    "EpisodeResult",
    "FailurePolicy",
    "GradeResult",
    "GradingError",
    "GuardedLLM",
    "Outcome",
    "PausableClock",
    "RunContext",
    "Span",
    "StageLimits",
    "Timeouts",
    "Trace",
    "TrajectoryLike",
    "Treatment",
    "within",
]
