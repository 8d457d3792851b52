"""The task repository in a sandbox: writing it for an episode, and taking the episode's diff out of it.

Both sides run git with a fixed environment of their own (``env -i``, no system or global config, no hooks, no
fsmonitor), so nothing an agent exported in its shell (``PATH``, ``GIT_*``) or put in the repository's
``.git/config`` changes what the commands do or print.
"""

from __future__ import annotations

import shlex

from skyrl_agent.sandbox.base import CommandResult, Sandbox
from skyrl_agent.tasks.format import SWETask, repo_files

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def git_command(*env: str) -> str:
    """The prefix that runs git with the fixed environment (plus ``env`` assignments) and safe configuration."""
    fixed = f"PATH={SAFE_PATH} HOME=/tmp LANG=C.UTF-8 GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null"
    return (
        f"/usr/bin/env -i {' '.join((fixed, *env))} git -c user.name=skyrl -c user.email=skyrl@localhost"
        " -c commit.gpgsign=false -c core.hooksPath=/dev/null -c core.fsmonitor=false"
        " -c core.attributesFile=/dev/null"
    )


GIT = git_command()
_DIFF_NAME = ".skyrl-submission.diff"
DIFF_PATH = f"/tmp/{_DIFF_NAME}"  # where the submission's diff lies in the sandbox
_DIFF_OPTIONS = "--binary --no-color --no-ext-diff --no-textconv --no-renames --src-prefix=a/ --dst-prefix=b/"


class WorkspaceError(RuntimeError):
    """The repository could not be written into the sandbox, or its diff could not be taken."""


async def prepare_workspace(task: SWETask, sandbox: Sandbox) -> str:
    """Make ``task.workdir`` an episode's repository: one commit, no history, no hidden tests; returns its id.

    A task with ``repo`` files gets them as a fresh git repository with a single commit. A task whose image holds
    the repository (``repo`` is ``None``) has that repository's history replaced by one commit of the same
    files, so ``git log --all`` or a tag cannot show the fix.
    """
    files = repo_files(task)
    if files:
        await write_repo(task, sandbox, files)
    else:
        await _run_checked(sandbox, task, f"rm -rf .git && {_COMMIT_ALL}", "replace the image repository's history")
    return (await _run_checked(sandbox, task, f"{GIT} rev-parse HEAD", "read the base commit")).output.strip()


async def write_repo(task: SWETask, sandbox: Sandbox, files: dict[str, bytes] | None = None) -> None:
    """Write the task's files into ``task.workdir`` and commit them as the repository's only commit."""
    for path, content in (files if files is not None else repo_files(task)).items():
        await sandbox.write_file(f"{task.workdir}/{path}", content)
    await _run_checked(sandbox, task, f"rm -rf .git && {_COMMIT_ALL}", "create the workspace git repository")


async def submission_diff(sandbox: Sandbox, workdir: str, base: str | None, *, timeout_s: float = 120.0) -> str:
    """The episode's changes (new files included) against commit ``base`` (default: ``HEAD``), whole.

    The diff goes through a temporary index and a file in the sandbox rather than the command output, so the
    agent's own index is untouched and a diff of any size arrives intact.
    """
    # "${TMPDIR:-/tmp}" is the sandbox's /tmp as its commands see it (see the process backend).
    index, out = '"${TMPDIR:-/tmp}/.skyrl-submission.index"', f'"${{TMPDIR:-/tmp}}/{_DIFF_NAME}"'
    git = git_command(f"GIT_INDEX_FILE={index}")
    ref = shlex.quote(base or "HEAD")
    command = (
        f"rm -f {index} && {git} read-tree {ref} && {git} add -A && "
        f"{git} diff --cached {_DIFF_OPTIONS} {ref} > {out}; code=$?; rm -f {index}; exit $code"
    )
    result = await sandbox.run(command, timeout_s=timeout_s, workdir=workdir)
    if result.exit_code != 0:
        raise WorkspaceError(f"could not take the repository's diff (exit {result.exit_code}): {result.output[-500:]}")
    return (await sandbox.read_file(DIFF_PATH)).decode("utf-8", errors="replace")


_COMMIT_ALL = f"{GIT} init -q && {GIT} add -A && {GIT} commit -q --allow-empty -m 'Initial commit'"


async def _run_checked(sandbox: Sandbox, task: SWETask, command: str, what: str) -> CommandResult:
    result = await sandbox.run(command, timeout_s=120.0, workdir=task.workdir)
    if result.exit_code != 0:
        raise WorkspaceError(f"task {task.id}: could not {what}: {result.output[-500:]}")
    return result
