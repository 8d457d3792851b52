"""A small reader for INI-style configuration files."""

from inikit.errors import ParseError
from inikit.parser import Config, parse

__all__ = ["Config", "ParseError", "parse"]
