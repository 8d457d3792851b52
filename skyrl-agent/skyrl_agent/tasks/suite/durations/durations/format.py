def format_duration(seconds: float) -> str:
    """Render a number of seconds as e.g. ``"1h 5m 3s"``; zero is ``"0s"`` and fractions are truncated."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    remaining = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if remaining > size:
            count, remaining = divmod(remaining, size)
            parts.append(f"{count}{unit}")
    if remaining or not parts:
        parts.append(f"{remaining}s")
    return " ".join(parts)
