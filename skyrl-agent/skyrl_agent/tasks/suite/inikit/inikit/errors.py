class ParseError(ValueError):
    """Raised for malformed input; ``lineno`` is the 1-based line number of the offending line."""

    def __init__(self, message: str, lineno: int) -> None:
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno
