from datetime import date, datetime, timedelta, timezone

from durations import add_business_days, to_utc


def test_add_within_week():
    assert add_business_days(date(2024, 3, 4), 2) == date(2024, 3, 6)  # Monday + 2


def test_add_zero_days():
    assert add_business_days(date(2024, 3, 6), 0) == date(2024, 3, 6)


def test_to_utc_naive():
    assert to_utc(datetime(2024, 1, 1, 12)) == datetime(2024, 1, 1, 12, tzinfo=timezone.utc)


def test_to_utc_already_utc():
    moment = datetime(2024, 1, 1, 12, tzinfo=timezone.utc)
    assert to_utc(moment) == moment
    assert to_utc(moment).utcoffset() == timedelta(0)
