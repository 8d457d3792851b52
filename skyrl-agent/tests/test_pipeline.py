"""The SWE pipeline's sandboxes: what each one is started with."""

from __future__ import annotations

import asyncio

from skyrl_agent.dispatch import Episode
from skyrl_agent.pipeline import TASK_LABEL, SWEPipeline
from skyrl_agent.sandbox.base import SandboxSpec
from skyrl_agent.tasks import load_suite
from skyrl_agent.testing import FakeSandbox


class RecordingBackend:
    """Hands out fake sandboxes and keeps the spec of each."""

    name = "recording"

    def __init__(self) -> None:
        self.specs: list[SandboxSpec] = []

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        self.specs.append(spec)
        return FakeSandbox()


def test_sandboxes_start_from_the_pipeline_spec_with_the_task_image_and_labels() -> None:
    task = load_suite()[0]
    backend = RecordingBackend()
    base = SandboxSpec(memory_mb=321, pids_limit=77, labels={"team": "a", "skyrl.run": "spec"})
    pipeline = SWEPipeline(backend, labels={"skyrl.run": "run-1"}, spec=base)  # type: ignore[arg-type]
    asyncio.run(pipeline.acquire(Episode(id="e1", data={"task": task})))
    (spec,) = backend.specs
    assert (spec.image, spec.workdir) == (task.base_image, task.workdir)
    assert (spec.memory_mb, spec.pids_limit) == (321, 77)
    assert spec.labels == {"team": "a", "skyrl.run": "run-1", TASK_LABEL: task.id}


def test_a_task_whose_hidden_tests_do_not_apply_is_a_grading_error_not_a_reward() -> None:
    from dataclasses import replace

    import pytest

    from skyrl_agent.dispatch import GradingError
    from skyrl_agent.dispatch.outcomes import Outcome, classify_error
    from skyrl_agent.sandbox.process_backend import ProcessBackend

    task = load_suite()[0]
    missing = (
        "diff --git a/tests/nope.py b/tests/nope.py\n--- a/tests/nope.py\n+++ b/tests/nope.py\n@@ -1 +1 @@\n-x\n+y\n"
    )
    broken = replace(task, test_patch=missing)  # edits a file the repository does not have
    trajectory = type("Submitted", (), {"submission": task.gold_patch})()
    pipeline = SWEPipeline(ProcessBackend())
    with pytest.raises(GradingError, match="test patch failed") as raised:
        asyncio.run(pipeline.grade(Episode(id="e1", data={"task": broken}), FakeSandbox(), trajectory))
    assert classify_error(raised.value, "grade") is Outcome.GRADING_ERROR  # masked: it says nothing of the patch
