_TRUE = {"1", "yes", "true", "on"}
_FALSE = {"0", "no", "false", "off"}


def to_bool(value: str) -> bool:
    """Interpret a configuration value as a boolean (``yes``/``no``, ``on``/``off``, ``1``/``0``...)."""
    word = value.strip()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"not a boolean: {value!r}")


def to_list(value: str, sep: str = ",") -> list[str]:
    """Split a value on ``sep``, dropping surrounding whitespace and empty items."""
    return [item.strip() for item in value.split(sep) if item.strip()]


def strip_inline_comment(value: str) -> str:
    """Remove a trailing ``;`` or ``#`` comment that is preceded by whitespace."""
    for marker in (" ;", " #", "\t;", "\t#"):
        index = value.find(marker)
        if index != -1:
            value = value[:index]
    return value.strip()
