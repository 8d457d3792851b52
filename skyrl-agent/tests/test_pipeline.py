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
