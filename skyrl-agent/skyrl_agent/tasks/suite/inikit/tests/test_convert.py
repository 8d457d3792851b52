import pytest

from inikit.convert import to_bool, to_list


def test_to_bool_basic_words():
    assert to_bool("yes") is True
    assert to_bool("off") is False


def test_to_bool_rejects_garbage():
    with pytest.raises(ValueError):
        to_bool("maybe")


def test_to_list_custom_separator():
    assert to_list("a:b: c", sep=":") == ["a", "b", "c"]
