import re

from minimark.escape import escape_html

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<![*\w])\*([^*\s][^*]*?)\*(?![*\w])")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def render_inline(text: str) -> str:
    """Render inline markup of one line: `code`, **bold**, *italic* and [links](url).

    Text inside code spans is shown literally: no emphasis or links are applied to it.
    """
    html = _CODE.sub(r"<code>\1</code>", escape_html(text))
    return _emphasis(html)


def _emphasis(text: str) -> str:
    text = _LINK.sub(r'<a href="\2">\1</a>', text)
    text = _BOLD.sub(r"<strong>\1</strong>", text)
    return _ITALIC.sub(r"<em>\1</em>", text)
