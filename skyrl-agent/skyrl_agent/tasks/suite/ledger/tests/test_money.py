import pytest

from ledger import Money


def test_parse_whole_amount():
    assert Money.parse("12.50").cents == 1250


def test_addition():
    assert (Money(150) + Money(275)).cents == 425


def test_currency_mismatch():
    with pytest.raises(ValueError):
        Money(1, "USD") + Money(1, "EUR")


def test_str():
    assert str(Money(1205)) == "12.05 USD"


def test_split_even():
    assert [m.cents for m in Money(900).split(3)] == [300, 300, 300]
