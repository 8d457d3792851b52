"""Render a small Markdown subset (headings, paragraphs, lists, emphasis, code) to HTML."""

from minimark.blocks import render
from minimark.inline import render_inline

__all__ = ["render", "render_inline"]
