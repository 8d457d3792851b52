"""Build the sandbox base image locally, without any image registry.

The image is a minimal Debian (``debootstrap --variant=minbase``) with python3, pytest, git and patch, plus an
unprivileged ``sandbox`` user. It is assembled from a root filesystem on disk and loaded with ``docker import``,
so it needs only the Debian package mirror.

Caching: the image carries the label ``skyrl.recipe`` whose value is a hash of everything that shapes it (the
suite, the package list, the user, the build steps' version). ``ensure_base_image`` builds only when no image
with that tag and that recipe exists, so re-running is a no-op. The root filesystem is archived as a sorted
tarball with fixed owners and timestamps, so two builds from the same package versions yield the same layer.

Requirements: root (debootstrap needs it), the ``debootstrap`` program, and a Docker engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

BASE_IMAGE = "skyrl-sandbox:base"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
RECIPE_LABEL = "skyrl.recipe"
# Bump when the build steps below change in a way the recipe fields do not capture.
BUILD_STEPS_VERSION = 1
# A fixed timestamp for every file in the archive (2024-01-01T00:00:00Z) keeps the layer reproducible.
SOURCE_DATE_EPOCH = 1704067200


class ImageBuildError(RuntimeError):
    """The base image could not be built; the message names the failed step and what to do."""


@dataclass(frozen=True)
class ImageRecipe:
    """Everything that determines the content of the sandbox base image."""

    tag: str = BASE_IMAGE
    suite: str = "bookworm"
    packages: tuple[str, ...] = ("python3", "python3-pytest", "git", "patch", "ca-certificates")
    user: str = "sandbox"
    uid: int = 1000
    extra_labels: dict[str, str] = field(default_factory=dict)

    def digest(self) -> str:
        """A short hash of the recipe, stored as an image label to detect stale images."""
        fields = {
            "suite": self.suite,
            "packages": sorted(self.packages),
            "user": self.user,
            "uid": self.uid,
            "steps": BUILD_STEPS_VERSION,
        }
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def debian_mirror() -> str:
    """The Debian mirror to bootstrap from: ``SKYRL_DEBIAN_MIRROR``, else the host's apt source, else Debian's."""
    if mirror := os.environ.get("SKYRL_DEBIAN_MIRROR"):
        return mirror
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    return DEFAULT_MIRROR


def image_recipe_of(tag: str) -> str | None:
    """The recipe label of a local image, or None when the image does not exist."""
    proc = subprocess.run(
        ["docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{RECIPE_LABEL}"}}}}', tag],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def is_current(recipe: ImageRecipe) -> bool:
    """Whether the local image under ``recipe.tag`` was built from exactly this recipe."""
    return image_recipe_of(recipe.tag) == recipe.digest()


def ensure_base_image(recipe: ImageRecipe | None = None, *, force: bool = False) -> str:
    """Build the base image unless an image of the same recipe exists; return its tag."""
    recipe = recipe or ImageRecipe()
    if not force and is_current(recipe):
        return recipe.tag
    build_image(recipe)
    return recipe.tag


def build_image(recipe: ImageRecipe, workdir: Path | None = None) -> None:
    """Bootstrap a root filesystem, prepare it, and import it into Docker under ``recipe.tag``."""
    _require_tools()
    with tempfile.TemporaryDirectory(prefix="skyrl-image-", dir=workdir) as tmp:
        rootfs = Path(tmp) / "rootfs"
        _bootstrap(recipe, rootfs)
        _prepare_rootfs(recipe, rootfs)
        _import_rootfs(recipe, rootfs)


def _require_tools() -> None:
    missing = [tool for tool in ("debootstrap", "docker", "tar") if shutil.which(tool) is None]
    if missing:
        raise ImageBuildError(
            f"missing programs: {', '.join(missing)}; on Debian run `make docker` (installs docker.io and "
            "debootstrap and starts dockerd) or `apt-get install -y debootstrap docker.io`"
        )
    if os.geteuid() != 0:
        raise ImageBuildError("building the base image needs root (debootstrap); run it as root or with sudo")


def _run(step: str, argv: list[str], **kwargs: object) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise ImageBuildError(f"{step} failed (exit {proc.returncode}): {' '.join(argv[:3])} …\n{tail}")


def _bootstrap(recipe: ImageRecipe, rootfs: Path) -> None:
    argv = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(sorted(recipe.packages))}",
        recipe.suite,
        str(rootfs),
        debian_mirror(),
    ]
    _run("debootstrap", argv)


def _prepare_rootfs(recipe: ImageRecipe, rootfs: Path) -> None:
    """Add the unprivileged user and a work directory; drop caches that only make the image bigger."""
    _run("useradd", ["chroot", str(rootfs), "useradd", "--create-home", "--uid", str(recipe.uid), recipe.user])
    workspace = rootfs / "workspace"
    workspace.mkdir(exist_ok=True)
    os.chown(workspace, recipe.uid, recipe.uid)
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log", "tmp"):
        target = rootfs / cache
        for child in target.glob("*"):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _import_rootfs(recipe: ImageRecipe, rootfs: Path) -> None:
    tar = subprocess.Popen(
        [
            "tar",
            "-C",
            str(rootfs),
            "--sort=name",
            f"--mtime=@{SOURCE_DATE_EPOCH}",
            "--numeric-owner",
            "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
            "-c",
            ".",
        ],
        stdout=subprocess.PIPE,
    )
    labels = {RECIPE_LABEL: recipe.digest(), **recipe.extra_labels}
    changes = [f"LABEL {key}={value}" for key, value in labels.items()]
    changes += ['CMD ["/bin/bash"]', "WORKDIR /workspace", "ENV LANG=C.UTF-8"]
    argv = ["docker", "import"]
    for change in changes:
        argv += ["--change", change]
    argv += ["-", recipe.tag]
    try:
        _run("docker import", argv, stdin=tar.stdout)
    finally:
        if tar.stdout is not None:
            tar.stdout.close()
        tar.wait()
    if tar.returncode != 0:
        raise ImageBuildError(f"archiving the root filesystem failed (tar exit {tar.returncode})")
