"""Daemon-free sandboxes: bubblewrap over an overlayfs copy-on-write layer on an image's root filesystem.

Layout of one sandbox (under the backend's ``work_dir``)::

    <id>/upper   the sandbox's writes (overlayfs upper layer)
    <id>/work    overlayfs bookkeeping
    <id>/merged  the root the sandbox sees: upper over [snapshot layers…] over the image rootfs

The shell runs as ``bwrap --unshare-{ipc,pid,net,uts,cgroup} --die-with-parent --new-session`` (no network,
own PID/IPC/UTS namespaces; no user namespace, see below) with a private ``/tmp`` (a tmpfs of ``tmp_size_mb``),
then drops to the sandbox user (uid/gid 1000, no capabilities, no-new-privileges) with rlimits on processes,
address space and file size. Timeouts are enforced inside, and a command's leftover processes are killed when it
returns, as for Docker (:mod:`.shell`).

* ``snapshot`` copies the upper dir (a frozen layer); ``fork`` mounts a new overlay with that layer as the top
  lower layer (a few ms). A discarded snapshot's layer is deleted once no mounted overlay and no kept snapshot
  stacks on it (:meth:`LocalBackend.discard_snapshot`); :meth:`LocalBackend.close` deletes the rest.
* The image rootfs is exported once from Docker (:func:`export_rootfs`, cached per image id), or the caller
  passes a directory.
* Mounting overlayfs needs root (CAP_SYS_ADMIN). Without it the backend falls back to copying the rootfs and
  the snapshot layers into the sandbox's directory: correct, but each create costs a full copy (seconds).
* A backend holds an exclusive ``flock`` on ``<work_dir>/.owner.lock`` while it lives; the kernel drops it when
  the process dies, however it dies. A new backend first sweeps the work dirs (``skyrl-local-*`` in the temporary
  directory, and its own ``work_dir``) whose lock nobody holds: it unmounts their overlays and deletes them
  (:func:`sweep_stale`). A directory without that file is not a backend's and is left alone.

Limits compared with Docker: no memory cgroup (``RLIMIT_AS`` per process instead), and ``RLIMIT_NPROC`` counts
every process of uid 1000 on the host, shared by all local sandboxes. The backend runs bwrap as root without a
user namespace (bwrap's ``--unshare-all`` would add one that maps only uid 0), then drops to the real uid 1000.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from skyrl_agent.sandbox.base import (
    SandboxSpec,
    SandboxStartError,
    SandboxUnavailableError,
    Snapshot,
)
from skyrl_agent.sandbox.shell import DEFAULT_OUTPUT_CAP, PersistentShell
from skyrl_agent.sandbox.shell_sandbox import ShellSandbox, check_snapshot_backend

BWRAP = "/usr/bin/bwrap"
SANDBOX_UID = 1000  # the image's ``sandbox`` user
# Not under /tmp: that is a tmpfs of one bwrap instance, and the state must survive a respawn (a new bwrap).
STATE_PATH = "/var/tmp/.skyrl-shell-state"
TMP_SIZE_MB = 512  # default size of a sandbox's /tmp (a tmpfs: its pages are host memory)
WORK_PREFIX = "skyrl-local-"  # default work dirs: <temporary directory>/skyrl-local-XXXXXXXX
LOCK_NAME = ".owner.lock"  # in a work dir: flocked by the live backend that owns it


def default_cache_dir() -> Path:
    """Where exported root filesystems are cached: ``$SKYRL_CACHE_DIR`` or ``~/.cache/skyrl-agent``."""
    return Path(os.environ.get("SKYRL_CACHE_DIR", Path.home() / ".cache" / "skyrl-agent")) / "rootfs"


def export_rootfs(image: str = "skyrl-sandbox:base", cache_dir: Path | None = None) -> Path:
    """The root filesystem of ``image`` as a directory, exported with the docker CLI once per image id.

    Raises:
        SandboxUnavailableError: the docker CLI or daemon is missing, or the image does not exist.
    """
    inspect = _docker(["image", "inspect", "--format", "{{.Id}}", image])
    dest = (cache_dir or default_cache_dir()) / inspect.strip().replace("sha256:", "")[:16]
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=dest.parent))
    cid = _docker(["create", "--label", "skyrl.export=1", image, "true"]).strip()
    try:
        export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
        subprocess.run(["tar", "--numeric-owner", "-x", "-C", str(tmp)], stdin=export.stdout, check=True)
        if export.stdout is not None:
            export.stdout.close()
        export.wait()
    finally:
        _docker(["rm", "-f", cid])
    tmp.rename(dest)  # atomic: a concurrent exporter either wins or finds the finished directory
    return dest


def _docker(args: list[str]) -> str:
    try:
        proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailableError(f"the docker CLI failed ({exc}); pass a rootfs directory instead") from exc
    if proc.returncode != 0:
        raise SandboxUnavailableError(f"docker {args[0]} failed: {proc.stderr.strip()}")
    return proc.stdout


_MNT_DETACH = 2


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _overlay_mount(lowers: list[Path], upper: Path, work: Path, merged: Path) -> bool:
    """Mount an overlay; False when this process may not mount (not root, or the kernel refuses).

    mount(2) directly: the ``mount`` program took ≈1.5 ms of a ≈19 ms fork.
    """
    if os.geteuid() != 0:
        return False
    options = f"lowerdir={':'.join(map(str, lowers))},upperdir={upper},workdir={work}"
    status: int = _libc().mount(b"overlay", os.fsencode(merged), b"overlay", 0, options.encode())
    return status == 0


def _unmount(merged: Path) -> None:
    """Detach the overlay (lazily, as ``umount -l``: a process that still holds it does not make this fail)."""
    _libc().umount2(os.fsencode(merged), _MNT_DETACH)


def _mounts_under(directory: Path) -> list[Path]:
    """Mount points below ``directory`` in this mount namespace, deepest first."""
    prefix = f"{directory}/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # mountinfo writes a space, tab, newline or backslash in a path as an octal escape (\040)
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if point.startswith(prefix):
            points.append(Path(point))
    return sorted(points, key=lambda path: len(path.parts), reverse=True)


def _hold_lock(work_dir: Path) -> int | None:
    """Make ``work_dir``'s lock file and hold its flock (an fd to keep); None if a live backend holds it.

    The file appears under its name already locked (made under another name, then renamed), so a sweeper never
    sees a live work dir's lock free.
    """
    final = work_dir / LOCK_NAME
    with contextlib.suppress(FileNotFoundError):
        return _try_lock(os.open(final, os.O_RDWR | os.O_CLOEXEC))
    fd = os.open(work_dir / f".{os.getpid()}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(work_dir / f".{os.getpid()}.lock", final)
    return fd


def _try_lock(fd: int) -> int | None:
    """``fd`` with an exclusive flock taken, or None (and ``fd`` closed) if someone holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _sweep(work_dir: Path) -> bool:
    """Unmount and delete ``work_dir`` if it is a backend's whose lock nobody holds; True if it was swept."""
    try:
        fd = _try_lock(os.open(work_dir / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC))
    except (FileNotFoundError, NotADirectoryError):
        return False  # not a backend's work dir (or already gone)
    if fd is None:
        return False  # its backend is alive
    try:
        for point in _mounts_under(work_dir):
            _unmount(point)
        shutil.rmtree(work_dir, ignore_errors=True)
    finally:
        os.close(fd)
    return True


def sweep_stale(parent: Path | None = None) -> list[Path]:
    """Remove what backends that died without ``close`` (a SIGKILL) left in ``parent``: overlay mounts, then dirs.

    Looks at the ``skyrl-local-*`` work dirs of ``parent`` (default: the temporary directory); a dir whose
    ``.owner.lock`` nobody holds is stale. Returns the dirs removed.
    """
    parent = Path(tempfile.gettempdir()) if parent is None else parent
    return [work_dir for work_dir in sorted(parent.glob(f"{WORK_PREFIX}*")) if _sweep(work_dir)]


@dataclass
class _Dirs:
    base: Path
    mounted: bool

    @property
    def upper(self) -> Path:
        return self.base / "upper" if self.mounted else self.base / "merged"

    @property
    def merged(self) -> Path:
        return self.base / "merged"


class LocalSandbox(ShellSandbox):
    """A bwrap-confined shell over its own overlay; :meth:`close` kills it and deletes the overlay.

    ``run``, ``read_file`` and ``write_file`` are :class:`~.shell_sandbox.ShellSandbox`'s.
    """

    def __init__(self, backend: LocalBackend, dirs: _Dirs, spec: SandboxSpec, lowers: list[Path]) -> None:
        argv = _bwrap_argv(spec, dirs.merged, backend.tmp_size_mb)
        shell = PersistentShell(
            argv, state_path=STATE_PATH, output_cap=backend.output_cap, env={}, own_pid_namespace=True
        )
        super().__init__(f"local-{dirs.base.name}", spec, shell)
        self.dirs = dirs
        self.lowers = lowers  # the layers under the upper dir, top first (snapshots, then the rootfs)
        self._backend = backend

    async def start(self) -> None:
        """Start the shell inside bwrap."""
        await self._shell.start(self.spec.workdir)

    async def snapshot(self) -> Snapshot:
        """Freeze a copy of the upper dir as a layer; ``ref`` is the overlay ``lowerdir`` list, top first."""
        self._check_open()
        return await self._backend.freeze(self)

    async def close(self) -> None:
        """Kill the shell (bwrap's PID namespace dies with it), unmount and delete the dirs; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._shell.close()
        await asyncio.to_thread(_destroy, self.dirs)
        await self._backend.forget(self)


def _bwrap_argv(spec: SandboxSpec, merged: Path, tmp_size_mb: int) -> list[str]:
    """The command prefix that runs a program in the sandbox over ``merged``, as the sandbox user (module docstring)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": f"/home/{spec.user}", "LANG": "C.UTF-8", **spec.env}
    setenv = [arg for key, value in env.items() for arg in ("--setenv", key, value)]
    nproc, address_mb = spec.pids_limit, spec.memory_mb
    limits = f"ulimit -u {nproc} -v {address_mb * 1024} -f {4 * 1024 * 1024}"  # -f: 4 GiB files at most
    drop = f"setpriv --reuid {SANDBOX_UID} --regid {SANDBOX_UID} --clear-groups --inh-caps=-all"
    drop += " --bounding-set=-all --no-new-privs"
    inner = f'{limits} && exec {drop} "$@"'  # "$@": the command runner, appended by PersistentShell
    return [
        BWRAP,
        "--bind", str(merged), "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--perms", "1777", "--size", str(tmp_size_mb << 20), "--tmpfs", "/tmp",
        # --unshare-all minus the user namespace: a root-run bwrap in a new user namespace maps only uid 0,
        # while dropping to the real uid 1000 keeps host ownership (root-owned /etc stays read-only).
        "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session",
        "--clearenv", *setenv,
        "--chdir", spec.workdir,
        "/bin/bash", "--noprofile", "--norc", "-c", inner, "skyrl",
    ]  # fmt: skip


def _delete_layers(layers: list[Path]) -> None:
    for layer in layers:
        shutil.rmtree(layer, ignore_errors=True)


def _destroy(dirs: _Dirs) -> None:
    if dirs.mounted:
        _unmount(dirs.merged)
    shutil.rmtree(dirs.base, ignore_errors=True)


class LocalBackend:
    """Creates :class:`LocalSandbox` es over ``rootfs`` (default: the exported ``spec.image``).

    Args:
        rootfs: an image root filesystem directory (read-only to sandboxes); exported from Docker when None.
        work_dir: where sandbox and snapshot dirs go (default: a fresh temporary directory, removed on close).
        output_cap: bytes of output kept per command.
        tmp_size_mb: size of each sandbox's ``/tmp`` tmpfs; a write past it fails with ENOSPC.

    Starting a backend sweeps the work dirs of dead backends first (module docstring, :func:`sweep_stale`).
    """

    name = "local"

    def __init__(
        self,
        rootfs: Path | None = None,
        *,
        work_dir: Path | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        tmp_size_mb: int = TMP_SIZE_MB,
    ):
        if not Path(BWRAP).exists():
            raise SandboxUnavailableError(f"{BWRAP} is missing; install bubblewrap (apt-get install bubblewrap)")
        if tmp_size_mb < 1:
            raise ValueError(f"tmp_size_mb must be at least 1, got {tmp_size_mb}")
        sweep_stale()
        if work_dir is not None:
            _sweep(work_dir)
            work_dir.mkdir(parents=True, exist_ok=True)
        self.rootfs = rootfs
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix=WORK_PREFIX))
        self._lock_fd = _hold_lock(self.work_dir)
        self.output_cap = output_cap
        self.tmp_size_mb = tmp_size_mb
        self._counter = 0
        self._open: set[LocalSandbox] = set()
        self._layers: dict[Path, list[Path]] = {}  # kept snapshot layer → the layers it stacks on (when mounted)
        self._discarded: set[Path] = set()  # snapshot layers to delete once nothing stacks on them
        self._forking: Counter[Path] = Counter()  # snapshot layer → forks from it in flight

    async def create(self, spec: SandboxSpec, *, lowers: list[Path] | None = None) -> LocalSandbox:
        """Start a sandbox over ``lowers`` (top first; default: the rootfs alone)."""
        if lowers is None:
            if self.rootfs is None:
                self.rootfs = await asyncio.to_thread(export_rootfs, spec.image)
            lowers = [self.rootfs]
        self._counter += 1
        base = self.work_dir / f"{os.getpid()}-{self._counter}"
        dirs = await asyncio.to_thread(_prepare, base, lowers)
        sandbox = LocalSandbox(self, dirs, spec, lowers)
        try:
            await sandbox.start()
        except Exception as exc:
            await sandbox.close()
            raise SandboxStartError(f"the bwrap sandbox did not start: {exc}") from exc
        self._open.add(sandbox)
        return sandbox

    async def fork(self, snapshot: Snapshot, n: int, spec: SandboxSpec) -> list[LocalSandbox]:
        """``n`` sandboxes whose lower layers are the snapshot's (one overlay mount each)."""
        check_snapshot_backend(snapshot, self.name)
        lowers = [Path(p) for p in snapshot.ref.split(":")]
        self._forking[lowers[0]] += 1  # the layer may not go while overlays are mounted on it (or copies made)
        try:
            return list(await asyncio.gather(*(self.create(spec, lowers=lowers) for _ in range(n))))
        finally:
            self._forking -= Counter({lowers[0]: 1})  # (drops the key at zero)
            if lowers[0] in self._discarded:  # discarded while this fork was in flight
                await self._remove_discarded()

    async def discard_snapshot(self, snapshot: Snapshot) -> None:
        """Delete the layer of ``snapshot`` now, or once the last overlay or kept snapshot stacked on it is gone.

        A mounted fork reads the layer as its overlay's lower layer, whose files must not change under it, so the
        deletion waits for the last such fork to close (a fork that copied the layers does not use it).
        Idempotent; a snapshot this backend does not keep (another's, or one deleted) is ignored.
        """
        layer = Path(snapshot.ref.split(":")[0])
        if snapshot.backend == self.name and layer in self._layers:
            self._discarded.add(layer)
            await self._remove_discarded()

    async def forget(self, sandbox: LocalSandbox) -> None:
        """Note that ``sandbox`` is closed: a discarded snapshot it was the last user of is deleted now."""
        self._open.discard(sandbox)
        await self._remove_discarded()

    def _in_use(self, layer: Path) -> bool:
        """Whether a fork in flight, an open mounted sandbox or a kept snapshot stacks on ``layer``."""
        return (
            layer in self._forking
            or any(sandbox.dirs.mounted and layer in sandbox.lowers for sandbox in self._open)
            or any(layer in lowers for lowers in self._layers.values())
        )

    async def _remove_discarded(self) -> None:
        """Delete the discarded layers nothing uses (deleting one may free those it stacked on)."""
        while unused := [layer for layer in self._discarded if not self._in_use(layer)]:
            for layer in unused:  # off the books before the deletion starts: concurrent calls delete it once
                self._discarded.discard(layer)
                del self._layers[layer]
            await asyncio.to_thread(_delete_layers, unused)

    async def freeze(self, sandbox: LocalSandbox) -> Snapshot:
        """Copy ``sandbox``'s upper dir into a snapshot layer owned by this backend."""
        self._counter += 1
        layer = self.work_dir / f"snap-{self._counter}"
        # cp -a keeps owners, modes, whiteouts (device nodes) and opaque-dir xattrs of the overlay upper dir.
        await asyncio.to_thread(subprocess.run, ["cp", "-a", str(sandbox.dirs.upper), str(layer)], check=True)
        if not sandbox.dirs.mounted:
            self._layers[layer] = []
            return Snapshot(backend=self.name, ref=str(layer))  # a full copy: the layer is a whole root
        self._layers[layer] = sandbox.lowers
        return Snapshot(backend=self.name, ref=":".join(map(str, [layer, *sandbox.lowers])))

    async def close(self) -> None:
        """Close open sandboxes and delete the work dir (snapshots included); idempotent."""
        await asyncio.gather(*(s.close() for s in list(self._open)))
        self._open.clear()
        self._layers.clear()
        self._discarded.clear()
        await asyncio.to_thread(shutil.rmtree, self.work_dir, True)
        lock_fd, self._lock_fd = self._lock_fd, None
        if lock_fd is not None:
            os.close(lock_fd)


def _prepare(base: Path, lowers: list[Path]) -> _Dirs:
    """Make the sandbox dirs and mount the overlay, or copy the layers when mounting is not permitted."""
    for name in ("upper", "work", "merged"):
        (base / name).mkdir(parents=True)
    if _overlay_mount(lowers, base / "upper", base / "work", base / "merged"):
        return _Dirs(base, mounted=True)
    for layer in reversed(lowers):  # bottom first, so upper layers overwrite (whiteouts are not honoured)
        subprocess.run(["cp", "-a", "--reflink=auto", f"{layer}/.", str(base / "merged")], check=True)
    # `cp -a` also copied the mode of each layer's own directory, which comes from how the layer was made
    # (export_rootfs renames a 0700 mkdtemp dir), not from the image: the sandbox user could not even traverse /.
    # An overlay takes its root's mode from the upper dir (0755); give the copy the same.
    (base / "merged").chmod(0o755)
    return _Dirs(base, mounted=False)
