"""Parse, format and do arithmetic with durations and business dates."""

from durations.calendar import add_business_days, to_utc
from durations.format import format_duration
from durations.parse import parse_duration

__all__ = ["add_business_days", "format_duration", "parse_duration", "to_utc"]
