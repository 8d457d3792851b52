from durations import format_duration


def test_seconds_only():
    assert format_duration(42) == "42s"


def test_zero():
    assert format_duration(0) == "0s"


def test_mixed():
    assert format_duration(3723) == "1h 2m 3s"


def test_negative():
    assert format_duration(-61) == "-1m 1s"
