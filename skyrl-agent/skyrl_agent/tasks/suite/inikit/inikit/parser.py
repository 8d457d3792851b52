from __future__ import annotations

from inikit.convert import strip_inline_comment, to_bool, to_list
from inikit.errors import ParseError


class Config:
    """Parsed sections of an INI file: ``section -> {key: value}``, keys lower-cased."""

    def __init__(self) -> None:
        self.sections: dict[str, dict[str, str]] = {}

    def get(self, section: str, key: str, default: str | None = None) -> str | None:
        """The value of ``key`` in ``section``, or ``default`` when the section or key is missing."""
        return self.sections[section].get(key.lower(), default)

    def get_bool(self, section: str, key: str, default: bool = False) -> bool:
        """The value of ``key`` as a boolean, or ``default`` when missing."""
        value = self.get(section, key)
        return default if value is None else to_bool(value)

    def get_list(self, section: str, key: str) -> list[str]:
        """The value of ``key`` split on commas (empty when missing)."""
        value = self.get(section, key)
        return [] if value is None else to_list(value)


def parse(text: str) -> Config:
    """Parse INI text. Repeated sections are merged; a later key overrides an earlier one."""
    config = Config()
    current: dict[str, str] | None = None
    for lineno, raw in enumerate(text.splitlines()):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError("unterminated section header", lineno)
            name = line[1:-1].strip()
            current = config.sections.setdefault(name, {})
            continue
        if current is None:
            raise ParseError("key outside of any section", lineno)
        key, sep, value = line.rpartition("=")
        if not sep:
            raise ParseError(f"expected 'key = value', got {line!r}", lineno)
        current[key.strip().lower()] = strip_inline_comment(value)
    return config
