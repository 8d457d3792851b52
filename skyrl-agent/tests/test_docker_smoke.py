"""A container starts from the locally built base image through the docker SDK and runs commands."""

from __future__ import annotations

import uuid

import pytest

from skyrl_agent.sandbox.image import BASE_IMAGE, RECIPE_LABEL, ImageRecipe

pytestmark = pytest.mark.docker


def test_base_image_runs_python_pytest_git_patch() -> None:
    import docker

    client = docker.from_env()
    name = f"skyrl-smoke-{uuid.uuid4().hex[:8]}"
    container = client.containers.run(
        BASE_IMAGE,
        ["sleep", "infinity"],
        name=name,
        detach=True,
        network_mode="none",
        user="sandbox",
        init=True,
        labels={"skyrl.test": "docker-smoke"},
    )
    try:
        code, out = container.exec_run(
            [
                "bash",
                "-c",
                "python3 -c 'print(6 * 7)' && python3 -m pytest --version && git --version && patch -v",
            ]
        )
        text = out.decode()
        assert code == 0, text
        assert text.splitlines()[0] == "42"
        assert "pytest" in text
        assert "git version" in text
        assert "GNU patch" in text
        code, out = container.exec_run(["id", "-un"])
        assert (code, out.decode().strip()) == (0, "sandbox")
        # network_mode="none" leaves only the loopback interface.
        code, out = container.exec_run(["python3", "-c", "import socket; print(socket.gethostbyname('example.com'))"])
        assert code != 0
    finally:
        container.remove(force=True)
    assert not client.containers.list(all=True, filters={"name": name})


def test_base_image_carries_current_recipe_label() -> None:
    import docker

    labels = docker.from_env().images.get(BASE_IMAGE).labels
    assert labels[RECIPE_LABEL] == ImageRecipe().digest()
