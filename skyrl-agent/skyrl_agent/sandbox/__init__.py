"""Sandboxes for agent episodes. For now: the locally built base image (see :mod:`.image`)."""

from skyrl_agent.sandbox.image import BASE_IMAGE, ImageBuildError, ImageRecipe, ensure_base_image

__all__ = ["BASE_IMAGE", "ImageBuildError", "ImageRecipe", "ensure_base_image"]
