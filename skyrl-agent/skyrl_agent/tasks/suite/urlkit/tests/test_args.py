from urlkit import parse_flags


def test_equals_form():
    assert parse_flags(["--name=x", "file"]) == ({"name": "x"}, ["file"])


def test_space_form():
    assert parse_flags(["--out", "dir", "a"]) == ({"out": "dir"}, ["a"])


def test_double_dash():
    assert parse_flags(["--", "--not-a-flag"]) == ({}, ["--not-a-flag"])
