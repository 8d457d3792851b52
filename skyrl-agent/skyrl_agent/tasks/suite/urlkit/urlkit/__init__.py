"""Helpers for URLs, query strings and command-line flags."""

from urlkit.args import parse_flags
from urlkit.query import build_query, parse_query
from urlkit.url import URL, join_path, split_url

__all__ = ["URL", "build_query", "join_path", "parse_flags", "parse_query", "split_url"]
