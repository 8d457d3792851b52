_REPLACEMENTS = (("<", "&lt;"), (">", "&gt;"), ('"', "&quot;"))


def escape_html(text: str) -> str:
    """Escape the characters that are special in HTML text and attribute values."""
    for char, entity in _REPLACEMENTS:
        text = text.replace(char, entity)
    return text
