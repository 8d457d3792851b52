import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from omegaconf import OmegaConf

from skyrl_gym.config import config_get


@dataclass
class SearchConfig:
    search_url: str = "http://localhost:8000/retrieve"
    topk: int = 3
    log_requests: bool | None = None


class ReadOnlyMapping(Mapping[str, Any]):
    """A Mapping that is not a dict and has no attribute access."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def test_none_config_returns_default() -> None:
    assert config_get(None, "topk", 7) == 7
    assert config_get(None, "topk") is None


def test_dataclass_config() -> None:
    cfg = SearchConfig(topk=5)
    assert config_get(cfg, "topk", 1) == 5
    assert config_get(cfg, "search_url") == "http://localhost:8000/retrieve"
    assert config_get(cfg, "missing", "d") == "d"


def test_present_none_value_is_returned_not_the_default() -> None:
    assert config_get(SearchConfig(), "log_requests", True) is None
    assert config_get({"log_requests": None}, "log_requests", True) is None


def test_dict_config() -> None:
    assert config_get({"topk": 4}, "topk", 1) == 4
    assert config_get({"topk": 4}, "missing", 1) == 1


def test_non_dict_mapping_uses_item_access() -> None:
    cfg = ReadOnlyMapping({"topk": 9})
    assert config_get(cfg, "topk", 1) == 9
    assert config_get(cfg, "other", 2) == 2


def test_namespace_config() -> None:
    assert config_get(types.SimpleNamespace(topk=2), "topk", 1) == 2


def test_mapping_keys_win_over_attributes() -> None:
    # dict has an attribute called "items"; a config key of that name must come from the mapping.
    assert config_get({"items": 3}, "items") == 3
    assert config_get({}, "items", "default") == "default"


def test_omegaconf_dict_config_in_struct_mode() -> None:
    cfg = OmegaConf.create({"topk": 3, "nested": {"url": "u"}, "required": "???", "nothing": None})
    OmegaConf.set_struct(cfg, True)
    assert config_get(cfg, "topk", 1) == 3
    assert config_get(cfg, "absent", "d") == "d"  # struct mode would raise on attribute access
    assert config_get(cfg, "required", "d") == "d"  # a missing mandatory value counts as absent
    assert config_get(cfg, "nothing", "d") is None
    assert config_get(config_get(cfg, "nested"), "url") == "u"


def test_config_module_does_not_import_omegaconf() -> None:
    import subprocess

    code = "import skyrl_gym.config, sys; print('omegaconf' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("cfg", [SearchConfig(), {"topk": 3}, OmegaConf.create({"topk": 3})])
def test_all_config_kinds_read_the_same(cfg: object) -> None:
    assert config_get(cfg, "topk", 0) == 3
