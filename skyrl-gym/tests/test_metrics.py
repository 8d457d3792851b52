import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from skyrl_gym import error
from skyrl_gym.envs import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register, registry
from skyrl_gym.metrics import aggregate_for_environment, default_aggregate_metrics


class StepsEnv(BaseTextEnv):
    def step(self, action: str) -> BaseTextEnvStepOutput:
        return {"observations": [], "reward": 0.0, "done": True, "metadata": {}}

    @staticmethod
    def aggregate_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
        return {"avg_steps": sum(m["steps"] for m in metrics) / len(metrics), "episodes": len(metrics)}


def plain_factory(**kwargs: Any) -> StepsEnv:
    return StepsEnv()


@pytest.fixture(autouse=True)
def _restore_registry() -> Iterator[None]:
    saved = dict(registry)
    yield
    registry.clear()
    registry.update(saved)


def test_empty_list_gives_empty_dict() -> None:
    assert default_aggregate_metrics([]) == {}


def test_averages_numeric_values_per_key() -> None:
    result = default_aggregate_metrics([{"a": 1, "b": 2.0}, {"a": 3, "b": 4.0}])
    assert result == {"a": 2.0, "b": 3.0}
    assert all(type(v) is float for v in result.values())


def test_bools_count_as_zero_or_one() -> None:
    assert default_aggregate_metrics([{"ok": True}, {"ok": False}, {"ok": True}]) == {"ok": pytest.approx(2 / 3)}


def test_non_numeric_values_are_dropped() -> None:
    result = default_aggregate_metrics([{"pred": "x", "n": 1, "lst": [1], "none": None, "c": 1j}])
    assert result == {"n": 1.0}


def test_keys_missing_from_some_episodes_average_over_the_rest() -> None:
    assert default_aggregate_metrics([{"a": 1}, {"b": 5}, {"a": 3}]) == {"a": 2.0, "b": 5.0}


def test_mixed_numeric_and_non_numeric_values_of_one_key() -> None:
    assert default_aggregate_metrics([{"a": 4}, {"a": "n/a"}]) == {"a": 4.0}


def test_numpy_scalars_are_numbers() -> None:
    result = default_aggregate_metrics([{"a": np.float32(1.5)}, {"a": np.int64(2)}, {"a": np.bool_(True)}])
    assert result["a"] == pytest.approx((1.5 + 2 + 1) / 3)


def test_nan_propagates() -> None:
    assert math.isnan(default_aggregate_metrics([{"a": float("nan")}, {"a": 1}])["a"])


def test_aggregate_for_environment_uses_the_env_class() -> None:
    register(id="steps", entry_point=StepsEnv)
    assert aggregate_for_environment("steps", [{"steps": 2}, {"steps": 4}]) == {"avg_steps": 3.0, "episodes": 2}


def test_aggregate_for_environment_resolves_string_entry_points() -> None:
    register(id="steps-lazy", entry_point=f"{__name__}:StepsEnv")
    assert aggregate_for_environment("steps-lazy", [{"steps": 1}]) == {"avg_steps": 1.0, "episodes": 1}


def test_aggregate_for_environment_defaults_for_base_classes() -> None:
    class Plain(BaseTextEnv):
        pass

    register(id="plain", entry_point=Plain)
    assert aggregate_for_environment("plain", [{"x": 1}, {"x": 0}]) == {"x": 0.5}


def test_aggregate_for_environment_factory_without_aggregate_falls_back() -> None:
    register(id="factory", entry_point=plain_factory)
    assert aggregate_for_environment("factory", [{"x": 2}]) == {"x": 2.0}


def test_aggregate_for_unknown_env_raises_value_error() -> None:
    with pytest.raises(ValueError, match="No registered env with id: nope") as info:
        aggregate_for_environment("nope", [])
    assert isinstance(info.value, error.Error)
