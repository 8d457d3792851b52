import re

_UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
_PART = re.compile(r"(\d+)\s*(ms|w|d|h|m|s)")


def parse_duration(text: str) -> float:
    """Parse durations such as ``"1h30m"``, ``"2d 4h"`` or ``"1.5h"`` into seconds.

    Raises ``ValueError`` for empty input or anything that is not a sequence of ``<number><unit>`` parts.
    """
    compact = text.strip().lower()
    if not compact:
        raise ValueError("empty duration")
    total = 0.0
    position = 0
    for match in _PART.finditer(compact):
        if compact[position : match.start()].strip():
            raise ValueError(f"invalid duration: {text!r}")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position == 0 or compact[position:].strip():
        raise ValueError(f"invalid duration: {text!r}")
    return total
