"""The test process's guard on the test runner: what code under test may not change, watched three ways.

The grading test run (:mod:`.testrun`) loads this file (standard library only, python ≥ 3.8) into the test process
before any code of the repository runs. Code under test runs in that process, so everything it can reach is
hostile. :class:`Tripwire` protects the *runner*: the modules of pytest, pluggy and unittest, the task's declared
plugins, the test run and itself.

1. The runner's modules get a module class whose ``__setattr__``/``__delattr__`` refuse and report a write to a
   global (``_pytest.runner.call_and_report = …``) that does not come from the runner's own code. "The runner's
   own code" is told by the identity of the caller's code object, which code under test cannot fake; pytest's
   ``monkeypatch`` and ``unittest.mock`` do not count, since they set attributes on their caller's behalf.
2. An audit hook (``sys.addaudithook``: it cannot be removed) refuses and reports the replacement of a runner
   function's ``__code__`` or defaults, and ``gc.get_referents`` of a class's ``__dict__`` proxy (the way to a
   class's writable dictionary).
3. A complete snapshot of those modules' globals, their classes' dictionaries and their functions' code and
   defaults, taken before the repository is imported, is compared with what is there: the classes and modules
   that turn a test call into its report every 50 ms of the run, everything at the end. Class attributes cannot
   be intercepted (no audit event covers them), so here a change counts unless the new value is the runner's
   own (one of its functions, an instance of one of its classes, plain data): pytest sets a few at run time.

Findings go to ``report`` the moment they are made, so code that later clears the test run's state hides nothing.
What remains possible (native code, walking the interpreter's memory, writing a dictionary directly and putting
it back before the session ends) is listed in docs/agent/tasks.md.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

RUNNER = ("pytest", "_pytest", "pluggy", "unittest", "iniconfig", "py", "__main__", "skyrl_tripwire")
# Runner code that sets attributes for its caller: a write through it is the caller's, not the runner's.
HELPERS = ("_pytest.monkeypatch", "unittest.mock")
# What turns a test call into its report: checked every 50 ms of the run, the rest at the end.
CRITICAL_CLASSES = {
    "_pytest.runner": ("CallInfo", "SetupState"),
    "_pytest.reports": ("BaseReport", "TestReport", "CollectReport"),
    "_pytest.python": ("Function", "Module", "Class"),
    "_pytest.nodes": ("Node", "Item"),
    "_pytest.unittest": ("TestCaseFunction",),
    "_pytest.main": ("Session",),
    "pluggy._hooks": ("HookCaller", "_HookCaller", "HookImpl", "HookimplMarker"),
    "pluggy._result": ("Result", "_Result"),
    "pluggy._manager": ("PluginManager",),
    "__main__": ("Reporter",),
    "skyrl_tripwire": ("Tripwire", "_GuardedModule"),
}
CRITICAL_MODULES = (*CRITICAL_CLASSES, "_pytest.skipping", "_pytest.outcomes", "pluggy._callers", "pytest")
_AUDITED = frozenset({"object.__setattr__", "object.__delattr__", "gc.get_referents"})
_MISSING = object()


def is_runner(name: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether module ``name`` belongs to the runner (with ``extra`` top-level packages: the declared plugins)."""
    return any(name == root or name.startswith(root + ".") for root in (*RUNNER, *extra))


class Tripwire:
    """Snapshots, guards and verifies the runner's modules (module docstring); ``report`` gets each finding."""

    def __init__(self, report: Callable[[str], None], extra: tuple[str, ...] = ()) -> None:
        self._report, self._extra = report, extra
        self._modules: dict[str, types.ModuleType] = {}
        self._globals: dict[str, dict[str, Any]] = {}
        self._classes: dict[type, dict[str, Any]] = {}
        self._functions: dict[types.FunctionType, tuple[Any, Any, Any]] = {}
        self._watched: set[int] = set()  # ids of the runner's classes and functions
        self._trusted: set[int] = set()  # ids of the runner's code objects (kept alive in _codes)
        self._codes: list[types.CodeType] = []
        self._expected: set[tuple[str, str]] = set()  # module globals the runner itself changed
        self._sent: set[str] = set()
        self._guarded: set[str] = set()
        self._critical: list[type] = []
        self._armed = False

    def arm(self) -> None:
        """Snapshot and guard the runner's modules imported so far, then install the audit hook (once)."""
        if not self._armed:
            _GuardedModule.tripwire = self  # before the snapshot: the class is watched from then on
        self.watch_new()
        if not self._armed:
            self._armed = True
            sys.addaudithook(self._audit)

    def watch_new(self) -> None:
        """Snapshot and guard the runner's modules imported since the last call (pytest imports some lazily)."""
        for name, module in list(sys.modules.items()):
            if name not in self._modules and isinstance(module, types.ModuleType) and is_runner(name, self._extra):
                self._snapshot(name, module)

    def verify(self, *, critical: bool = False) -> list[str]:
        """What changed in the runner since its snapshot, other than by the runner itself; each is reported.

        ``critical``: only the classes and modules that turn a test call into its report (cheap enough for every
        test phase, so a change that is put back before the session ends is still seen).
        """
        if not critical:
            self.watch_new()
        for name in CRITICAL_MODULES if critical else list(self._modules):
            if name in self._modules:
                self._verify_module(name, self._modules[name])
        for cls in self._critical if critical else list(self._classes):
            self._verify_class(cls, self._classes[cls])
        if not critical:
            for function, parts in self._functions.items():
                if any(now is not then for now, then in zip(_parts(function), parts)):  # noqa: B905 (python 3.8)
                    self.found(f"the code or defaults of {function.__module__}.{function.__qualname__} were replaced")
        return sorted(self._sent)

    def _verify_module(self, name: str, module: types.ModuleType) -> None:
        if sys.modules.get(name) is not module and name != "__main__":
            self.found(f"sys.modules[{name!r}] was replaced")
        if type(module) is not _GuardedModule and name in self._guarded:
            self.found(f"the module class of {name} was replaced")
        current = vars(module)
        for attr, value in self._globals[name].items():
            if current.get(attr, _MISSING) is not value and (name, attr) not in self._expected:
                self.found(f"{name}.{attr} was replaced")

    def _verify_class(self, cls: type, members: dict[str, Any]) -> None:
        """A class attribute changed is a finding unless the runner's own code or data is what is there now.

        Class writes cannot be intercepted (no audit event covers them), so what pytest itself sets at run time
        (legacy properties, flags, its debugger's config) is told apart by the value: a function of the runner,
        an instance of one of its classes, or plain data.
        """
        current = cls.__dict__
        for attr in set(members) | set(current):
            value = current.get(attr, _MISSING)
            if value is not members.get(attr, _MISSING) and not self._runner_value(value):
                self.found(f"{cls.__module__}.{cls.__qualname__}.{attr} was changed")

    def _runner_value(self, value: Any) -> bool:
        if value is _MISSING:
            return False
        if value is None or type(value) in (bool, int, float, str, list, dict):
            return True
        if id(type(value)) in self._watched:
            return True
        functions = _functions_in(value)
        return bool(functions) and all(id(function.__code__) in self._trusted for function in functions)

    def found(self, problem: str) -> None:
        """Report ``problem`` once."""
        if problem not in self._sent:
            self._sent.add(problem)
            self._report(problem)

    def runner_code(self, frame: Any) -> bool:
        """Whether ``frame`` runs a code object of the runner (not of a helper that writes for its caller)."""
        return frame is not None and id(frame.f_code) in self._trusted

    def module_write(self, module: types.ModuleType, attr: str, value: Any, frame: Any) -> None:
        """A write to a guarded module's global: expected from the runner, refused from anyone else.

        Binding a new name to a module is how an import of a submodule shows on its package: allowed.
        """
        if isinstance(value, types.ModuleType) and attr not in vars(module):
            return
        if self.runner_code(frame):
            self._expected.add((module.__name__, attr))
            return
        self.found(f"code under test assigned {module.__name__}.{attr}")
        raise AttributeError(f"{module.__name__}.{attr} belongs to the test runner; code under test may not set it")

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in _AUDITED:
            return
        if event == "gc.get_referents":
            if any(isinstance(obj, types.MappingProxyType) for obj in args[0]):
                self.found("code under test asked gc for the dictionary behind a class's __dict__")
                raise RuntimeError("the runner's class dictionaries are read-only to code under test")
            return
        target = args[0]
        if id(target) in self._watched and not self.runner_code(sys._getframe(1)):
            name = getattr(target, "__qualname__", repr(target))
            self.found(f"code under test set {getattr(target, '__module__', '?')}.{name}.{args[1]}")
            raise AttributeError(f"{name}.{args[1]} belongs to the test runner; code under test may not set it")

    def _snapshot(self, name: str, module: types.ModuleType) -> None:
        self._modules[name] = module
        self._globals[name] = dict(vars(module))
        trusted = not any(name == helper or name.startswith(helper + ".") for helper in HELPERS)
        for value in list(self._globals[name].values()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                self._class(value, trusted)
            elif isinstance(value, types.FunctionType) and value.__module__ == name:
                self._function(value, trusted)
        if type(module) is types.ModuleType:
            module.__class__ = _GuardedModule
            self._guarded.add(name)
        for qualname in CRITICAL_CLASSES.get(name, ()):
            cls = getattr(module, qualname, None)
            if isinstance(cls, type) and cls in self._classes:
                self._critical.append(cls)

    def _class(self, cls: type, trusted: bool) -> None:
        if cls in self._classes:
            return
        self._classes[cls] = dict(cls.__dict__)
        self._watched.add(id(cls))
        for value in self._classes[cls].values():
            for function in _functions_in(value):
                self._function(function, trusted)

    def _function(self, function: types.FunctionType, trusted: bool) -> None:
        if function in self._functions:
            return
        self._functions[function] = _parts(function)
        self._watched.add(id(function))
        if trusted:
            stack = [function.__code__]
            while stack:
                code = stack.pop()
                self._codes.append(code)
                self._trusted.add(id(code))
                stack.extend(const for const in code.co_consts if isinstance(const, types.CodeType))


def _parts(function: types.FunctionType) -> tuple[Any, Any, Any]:
    return function.__code__, function.__defaults__, function.__kwdefaults__


def _functions_in(value: Any) -> list[types.FunctionType]:
    """The plain functions behind a class attribute: methods, static and class methods, property accessors."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if isinstance(f, types.FunctionType)]
    return [value] if isinstance(value, types.FunctionType) else []


class _GuardedModule(types.ModuleType):
    """The class of the runner's modules: global writes go through :meth:`Tripwire.module_write` first."""

    tripwire: Tripwire

    def __setattr__(self, name: str, value: Any) -> None:
        type(self).tripwire.module_write(self, name, value, sys._getframe(1))
        types.ModuleType.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        type(self).tripwire.module_write(self, name, None, sys._getframe(1))
        types.ModuleType.__delattr__(self, name)
