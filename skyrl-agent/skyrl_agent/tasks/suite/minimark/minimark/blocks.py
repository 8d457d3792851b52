import re

from minimark.inline import render_inline

_CLOSING_HASHES = re.compile(r"\s+#+$")


def render(source: str) -> str:
    """Render a document: ``#`` headings (levels 1-6), ``-``/``*`` bullet lists and paragraphs.

    Blocks are separated by blank lines; consecutive text lines form one paragraph.
    """
    html: list[str] = []
    paragraph: list[str] = []
    items: list[str] = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith(("- ", "* ")):
            _flush_paragraph(paragraph, html)
            items.append(stripped[2:])
            continue
        _flush_list(items, html)
        if not stripped:
            _flush_paragraph(paragraph, html)
        elif stripped.startswith("#"):
            _flush_paragraph(paragraph, html)
            html.append(_heading(stripped))
        else:
            paragraph.append(stripped)
    _flush_paragraph(paragraph, html)
    return "\n".join(html)


def _heading(line: str) -> str:
    marks = len(line) - len(line.lstrip("#"))
    level = min(marks, 6)
    text = line[marks:].strip()
    return f"<h{level}>{render_inline(text)}</h{level}>"


def _flush_paragraph(lines: list[str], html: list[str]) -> None:
    if lines:
        html.append(f"<p>{render_inline(' '.join(lines))}</p>")
        lines.clear()


def _flush_list(items: list[str], html: list[str]) -> None:
    if items:
        body = "".join(f"<li>{render_inline(item)}</li>" for item in items)
        html.append(f"<ul>{body}</ul>")
        items.clear()
