from __future__ import annotations

import pytest

from skyrl_agent.sandbox.process_backend import ProcessBackend


@pytest.fixture
def backend() -> ProcessBackend:
    """Subprocesses in temporary directories: fast and enough to exercise grading (no isolation needed here)."""
    return ProcessBackend()
