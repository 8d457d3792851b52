from __future__ import annotations

import pytest

from skyrl_agent import cli
from skyrl_agent.sandbox import image


def test_recipe_digest_is_stable_and_sensitive() -> None:
    base = image.ImageRecipe()
    assert base.digest() == image.ImageRecipe().digest()
    # Package order does not matter; content does.
    assert image.ImageRecipe(packages=tuple(reversed(base.packages))).digest() == base.digest()
    assert image.ImageRecipe(packages=(*base.packages, "curl")).digest() != base.digest()
    assert image.ImageRecipe(suite="trixie").digest() != base.digest()
    # The tag names the image; it does not change what is inside.
    assert image.ImageRecipe(tag="other:tag").digest() == base.digest()


def test_mirror_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYRL_DEBIAN_MIRROR", "http://mirror.invalid/debian")
    assert image.debian_mirror() == "http://mirror.invalid/debian"


def test_build_without_tools_explains_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image.shutil, "which", lambda _name: None)
    with pytest.raises(image.ImageBuildError, match="make docker"):
        image.build_image(image.ImageRecipe(tag="skyrl-test:never"))


def test_cli_reports_build_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(image, "is_current", lambda _recipe: False)
    monkeypatch.setattr(image.shutil, "which", lambda _name: None)
    assert cli.main(["image", "build", "--tag", "skyrl-test:never"]) == 2
    assert "missing programs" in capsys.readouterr().err


def test_cli_skips_current_image(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(image, "is_current", lambda _recipe: True)
    monkeypatch.setattr(image, "build_image", lambda _recipe: pytest.fail("must not rebuild a current image"))
    assert cli.main(["image", "build"]) == 0
    assert "up to date" in capsys.readouterr().out
