"""The episode's repository: history stripped, and a diff taken by the grader's own git, whole."""

import asyncio
from dataclasses import replace

import pytest

from skyrl_agent.agents.tool_env import SandboxToolEnv
from skyrl_agent.sandbox.base import SandboxSpec
from skyrl_agent.sandbox.process_backend import ProcessBackend
from skyrl_agent.tasks import grade, load_suite, prepare_workspace, submission_diff
from skyrl_agent.tasks.format import repo_files

TASK = next(task for task in load_suite() if task.id == "durations-format-exact-hour")
BIG = "".join(f"LINE_{i:06d} = {i} * 2  # generated, to make the diff large\n" for i in range(4000))  # ≈240 KB


async def _with_sandbox(backend, scenario):
    sandbox = await backend.create(SandboxSpec(image=TASK.base_image, workdir=TASK.workdir))
    try:
        return await scenario(sandbox)
    finally:
        await sandbox.close()


def test_a_diff_far_over_the_output_cap_reaches_the_grader_intact():
    async def scenario(sandbox):
        base = await prepare_workspace(TASK, sandbox)
        fix = await sandbox.run(f"git apply <<'EOF'\n{TASK.gold_patch}\nEOF", workdir=TASK.workdir)
        assert fix.exit_code == 0, fix.output
        await sandbox.write_file(f"{TASK.workdir}/durations/table.py", BIG)
        tools = SandboxToolEnv(sandbox, workdir=TASK.workdir, base_commit=base)
        return await tools.diff()

    backend = ProcessBackend()
    patch = asyncio.run(_with_sandbox(backend, scenario))
    assert len(patch.encode()) > 3 * 64 * 1024
    assert patch.count("\n+LINE_") == 4000
    result = asyncio.run(grade(TASK, patch, backend))
    assert result.resolved, result.error


def test_the_diff_ignores_the_repository_git_config_and_the_agent_index():
    async def scenario(sandbox):
        base = await prepare_workspace(TASK, sandbox)
        await sandbox.write_file(f"{TASK.workdir}/durations/new.py", "x = 1\n")
        clean = await submission_diff(sandbox, TASK.workdir, base)
        config = "[diff]\n\tnoprefix = true\n\texternal = /bin/false\n[core]\n\tfsmonitor = /bin/false\n"
        hostile = await sandbox.run(
            f"printf '{config}' >> .git/config && git add durations/new.py && git commit -qm hide && "
            "printf '*.py diff=fake\\n' > .gitattributes",
            workdir=TASK.workdir,
        )
        assert hostile.exit_code == 0, hostile.output
        return clean, await submission_diff(sandbox, TASK.workdir, base)

    clean, after = asyncio.run(_with_sandbox(ProcessBackend(), scenario))
    assert "+++ b/durations/new.py" in clean
    # Committing the change hides nothing (the diff is against the base), and the config changes no byte of it:
    # what is added is the new .gitattributes file (sorted first), with its a/ b/ prefixes.
    attributes = after[: after.index("diff --git a/durations/new.py")]
    assert attributes.startswith("diff --git a/.gitattributes b/.gitattributes\n")
    assert after == attributes + clean


def test_an_image_repository_loses_its_history():
    async def scenario(sandbox):
        for path, content in repo_files(TASK).items():
            await sandbox.write_file(f"{TASK.workdir}/{path}", content)
        setup = await sandbox.run(
            "git init -q && git add -A && git -c user.name=a -c user.email=a@b commit -qm base && "
            "echo fix >> durations/format.py && git -c user.name=a -c user.email=a@b commit -qam 'the fix' && "
            "git tag v2 && git checkout -q HEAD~1",
            workdir=TASK.workdir,
        )
        assert setup.exit_code == 0, setup.output
        await prepare_workspace(replace(TASK, repo=None), sandbox)
        return await sandbox.run(
            "git log --all --oneline | wc -l; git tag | wc -l; git status -s", workdir=TASK.workdir
        )

    log = asyncio.run(_with_sandbox(ProcessBackend(), scenario))
    assert log.output.split() == ["1", "0"]


@pytest.mark.docker
def test_exported_variables_in_the_agent_shell_do_not_change_the_diff():
    from skyrl_agent.tasks.validate import make_backend

    async def scenario(sandbox):
        base = await prepare_workspace(TASK, sandbox)
        await sandbox.write_file(f"{TASK.workdir}/durations/new.py", "x = 1\n")
        clean = await submission_diff(sandbox, TASK.workdir, base)
        fake_git = '#!/bin/sh\\necho "diff --git a/forged b/forged"\\n'
        hostile = await sandbox.run(
            f"mkdir -p /tmp/bin && printf '{fake_git}' > /tmp/bin/git && chmod +x /tmp/bin/git && "
            "export PATH=/tmp/bin:$PATH GIT_DIR=/nonexistent GIT_INDEX_FILE=/tmp/idx GIT_WORK_TREE=/tmp "
            "GIT_CONFIG_PARAMETERS=\"'diff.noprefix=true'\"",
            workdir=TASK.workdir,
        )
        assert hostile.exit_code == 0, hostile.output
        persisted = await sandbox.run("git; echo $GIT_DIR", workdir=TASK.workdir)
        assert "forged" in persisted.output  # the agent's shell has them
        assert "/nonexistent" in persisted.output
        return clean, await submission_diff(sandbox, TASK.workdir, base)

    backend = make_backend("docker")
    try:
        clean, after = asyncio.run(_with_sandbox(backend, scenario))
    finally:
        asyncio.run(backend.close())
    assert "+++ b/durations/new.py" in clean
    assert after == clean
