import subprocess
import sys
import types
from typing import Any

import pytest

import skyrl_gym.tools
from skyrl_gym import error
from skyrl_gym.tools.core import ToolGroup, tool


class MathTools(ToolGroup):
    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        super().__init__(name="MathTools")

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two numbers."""
        return a + b + self.offset

    @tool
    def scale(self, x: float, *, factor: float = 2.0) -> float:
        return x * factor

    def helper(self) -> str:
        return "not a tool"


class MoreMath(MathTools):
    @tool
    def add(self, a: int, b: int) -> int:
        return 100

    @tool
    def negate(self, x: int) -> int:
        return -x


class PropertyTools(ToolGroup):
    touched = False

    def __init__(self) -> None:
        super().__init__(name="PropertyTools")

    @property
    def expensive(self) -> str:
        type(self).touched = True
        return "value"

    @tool
    def ping(self) -> str:
        return "pong"


def test_tool_on_the_class_is_the_descriptor() -> None:
    descriptor = MathTools.__dict__["add"]
    assert isinstance(descriptor, tool)
    assert MathTools.add is descriptor
    assert descriptor.name == "add"
    assert descriptor.func.__name__ == "add"
    assert descriptor.__doc__ == "Add two numbers."


def test_tool_on_an_instance_is_a_bound_method() -> None:
    group = MathTools(offset=1)
    assert group.add(1, 2) == 4
    assert group.add.__self__ is group  # type: ignore[attr-defined]


def test_group_registers_only_tools() -> None:
    group = MathTools()
    assert sorted(group.get_tool_names()) == ["add", "scale"]
    assert group.get_name() == "MathTools"
    assert group.name == "MathTools"


def test_get_tool_returns_a_bound_callable_or_none() -> None:
    group = MathTools(offset=10)
    add = group.get_tool("add")
    assert add is not None
    assert add(1, 1) == 12
    assert group.get_tool("helper") is None
    assert group.get_tool("missing") is None


def test_execute_tool_passes_positional_and_keyword_arguments() -> None:
    group = MathTools()
    assert group.execute_tool("add", 2, 3) == 5
    assert group.execute_tool("scale", 3.0, factor=3.0) == 9.0


def test_execute_unknown_tool_message() -> None:
    group = MathTools()
    with pytest.raises(ValueError, match=r"^Tool 'helper' not found in group 'MathTools'\.$") as info:
        group.execute_tool("helper")
    assert isinstance(info.value, error.ToolNotFoundError)
    assert isinstance(info.value, error.Error)


def test_tool_to_group_mapping() -> None:
    assert MathTools().get_tool_to_group_mapping() == {"add": "MathTools", "scale": "MathTools"}


def test_subclass_overrides_and_adds_tools() -> None:
    group = MoreMath()
    assert sorted(group.get_tool_names()) == ["add", "negate", "scale"]
    assert group.execute_tool("add", 1, 2) == 100
    assert group.execute_tool("negate", 4) == -4


def test_registration_does_not_evaluate_properties() -> None:
    group = PropertyTools()
    assert group.get_tool_names() == ["ping"]
    assert PropertyTools.touched is False


def test_each_instance_binds_its_own_tools() -> None:
    first, second = MathTools(offset=1), MathTools(offset=2)
    assert first.execute_tool("add", 0, 0) == 1
    assert second.execute_tool("add", 0, 0) == 2


def test_repr_lists_tools() -> None:
    assert repr(MathTools()) == "MathTools(name='MathTools', tools=['add', 'scale'])"


def test_tools_package_exports() -> None:
    assert skyrl_gym.tools.ToolGroup is ToolGroup
    assert skyrl_gym.tools.tool is tool
    assert set(skyrl_gym.tools.__all__) >= {
        "PythonCodeExecutorToolGroup",
        "SearchToolGroup",
        "SQLCodeExecutorToolGroup",
    }
    assert "SearchToolGroup" in dir(skyrl_gym.tools)


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchToolGroup"):
        _ = skyrl_gym.tools.NoSuchToolGroup


def test_lazy_export_imports_the_defining_module(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("skyrl_gym.tools.search")

    class SearchToolGroup(ToolGroup):
        def __init__(self) -> None:
            super().__init__(name="SearchToolGroup")

    fake.SearchToolGroup = SearchToolGroup  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "skyrl_gym.tools.search", fake)
    namespace: dict[str, Any] = vars(skyrl_gym.tools)
    cached = namespace.pop("SearchToolGroup", None)
    try:
        assert skyrl_gym.tools.SearchToolGroup is SearchToolGroup
        assert namespace["SearchToolGroup"] is SearchToolGroup  # cached after the first access
    finally:
        namespace.pop("SearchToolGroup", None)
        if cached is not None:
            namespace["SearchToolGroup"] = cached


def test_importing_tools_does_not_import_tool_modules() -> None:
    code = (
        "import sys, skyrl_gym.tools; "
        "print([m for m in ('skyrl_gym.tools.python', 'skyrl_gym.tools.search', 'skyrl_gym.tools.sql') "
        "if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_subclass_attribute_hides_an_inherited_tool() -> None:
    class NoAdd(MathTools):
        add = None  # type: ignore[assignment]

    assert NoAdd().get_tool_names() == ["scale"]
    assert MoreMath().get_tool_names() == ["add", "negate", "scale"]
    assert MoreMath().execute_tool("add", 1, 2) == 100
