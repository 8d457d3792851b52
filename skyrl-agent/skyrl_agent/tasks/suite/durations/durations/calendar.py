from datetime import date, datetime, timedelta, timezone


def is_business_day(day: date) -> bool:
    """Monday to Friday."""
    return day.weekday() < 6


def add_business_days(start: date, days: int) -> date:
    """The date ``days`` business days after ``start`` (weekends skipped); ``days`` must be >= 0."""
    if days < 0:
        raise ValueError("days must be non-negative")
    current = start
    while days > 0:
        current += timedelta(days=1)
        if is_business_day(current):
            days -= 1
    return current


def to_utc(moment: datetime) -> datetime:
    """Convert ``moment`` to UTC; a naive datetime is taken to already be in UTC."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.replace(tzinfo=timezone.utc)
