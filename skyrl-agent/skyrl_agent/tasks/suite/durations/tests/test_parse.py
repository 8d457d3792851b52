import pytest

from durations import parse_duration


def test_single_units():
    assert parse_duration("90s") == 90
    assert parse_duration("2m") == 120
    assert parse_duration("1d") == 86400


def test_combined():
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2d 4h") == 2 * 86400 + 4 * 3600


def test_milliseconds():
    assert parse_duration("250ms") == pytest.approx(0.25)


@pytest.mark.parametrize("text", ["", "abc", "10", "5x"])
def test_invalid(text):
    with pytest.raises(ValueError):
        parse_duration(text)
