from urllib.parse import quote, unquote


def parse_query(query: str) -> dict[str, list[str]]:
    """Parse ``a=1&b=x+y&a=2`` into ``{"a": ["1", "2"], "b": ["x y"]}`` (``+`` and ``%XX`` decoded)."""
    result: dict[str, list[str]] = {}
    for pair in query.lstrip("?").split("&"):
        if not pair:
            continue
        key, _, value = pair.partition("=")
        result.setdefault(unquote(key), []).append(unquote(value))
    return result


def build_query(params: dict[str, str | list[str]]) -> str:
    """The inverse of :func:`parse_query`; keys keep their insertion order."""
    pairs = []
    for key, value in params.items():
        for item in [value] if isinstance(value, str) else value:
            pairs.append(f"{quote(key, safe='')}={quote(item, safe='')}")
    return "&".join(pairs)
