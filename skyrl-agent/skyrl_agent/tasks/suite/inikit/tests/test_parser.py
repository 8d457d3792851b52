import pytest

from inikit import ParseError, parse


def test_sections_and_keys():
    config = parse("[server]\nhost = example.org\nport = 8080\n")
    assert config.get("server", "host") == "example.org"
    assert config.get("server", "port") == "8080"


def test_keys_are_case_insensitive():
    config = parse("[db]\nUser = admin\n")
    assert config.get("db", "USER") == "admin"


def test_comments_are_ignored():
    config = parse("# top\n[a]\n; note\nx = 1 ; trailing\n")
    assert config.get("a", "x") == "1"


def test_missing_key_returns_default():
    config = parse("[a]\nx = 1\n")
    assert config.get("a", "y", "fallback") == "fallback"


def test_key_outside_section_is_an_error():
    with pytest.raises(ParseError):
        parse("x = 1\n")


def test_get_list():
    config = parse("[a]\nitems = one, two,, three\n")
    assert config.get_list("a", "items") == ["one", "two", "three"]
