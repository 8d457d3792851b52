import pytest

from ledger import Inventory


def test_add_and_count():
    inventory = Inventory()
    inventory.add("apple", 3)
    inventory.add("apple", 2)
    assert inventory.count("apple") == 5


def test_remove():
    inventory = Inventory()
    inventory.add("pear", 4)
    inventory.remove("pear", 3)
    assert inventory.count("pear") == 1


def test_add_rejects_non_positive():
    with pytest.raises(ValueError):
        Inventory().add("x", 0)
