"""Reading a config: a YAML file plus ``a.b=c`` overrides, each value converted to its field's type.

YAML values arrive typed; a value typed on the command line arrives as text and is parsed by the type of the
field it sets (``trainer.seed=1`` → 1, ``data.train_data=a.parquet,b.parquet`` → a list, ``null`` → None for an
optional field). Every failure is a :class:`~skyrl_train.config.schema.ConfigError` naming the key: an unknown key
with the closest known one, a removed key with what replaces it, a value with the type it should have had.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from skyrl_train.annotations import type_name
from skyrl_train.config.schema import REMOVED_KEYS, Config, ConfigError

__all__ = ["apply_overrides", "from_dict", "load_config", "record_config", "to_dict", "to_yaml"]


# ----------------------------------------------------------------------------------------- dict conversion


class _Raw(str):
    """A value typed on the command line: parsed by the target field's type (YAML values are already typed)."""

    __slots__ = ()


_NULLS = frozenset({"null", "none", "~"})
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


def to_dict(config: Config) -> dict[str, Any]:
    """The config as plain nested dicts/lists/scalars (JSON- and YAML-safe); ``from_dict`` inverts it."""
    return dataclasses.asdict(config)


def from_dict(data: Mapping[str, Any]) -> Config:
    """Build a :class:`Config` from nested mappings; absent keys keep their defaults.

    Raises:
        ConfigError: an unknown section or key (with the closest known key), or a value of the wrong type.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"a config must be a mapping of sections, got {type(data).__name__}")
    sections = _fields_of(Config)
    for name in data:
        if name not in sections:
            raise ConfigError(_unknown_key_message(str(name)))
    built = {name: _build_section(name, sections[name], data[name]) for name in sections if name in data}
    return Config(**built)


def _build_section(name: str, cls: Any, values: Any) -> Any:
    if values is None:
        return cls()
    if not isinstance(values, Mapping):
        raise ConfigError(f"{name} must be a mapping of fields, got {type(values).__name__}: {values!r}")
    hints = _fields_of(cls)
    kwargs = {}
    for key, value in values.items():
        dotted = f"{name}.{key}"
        if key not in hints:
            raise ConfigError(_unknown_key_message(dotted))
        kwargs[key] = _coerce(value, hints[key], dotted)
    return cls(**kwargs)


def _fields_of(cls: Any) -> dict[str, Any]:
    """Field name → resolved type annotation, in declaration order."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _all_keys() -> list[str]:
    keys = []
    for section, cls in _fields_of(Config).items():
        keys.append(section)
        keys.extend(f"{section}.{name}" for name in _fields_of(cls))
    return keys


def _unknown_key_message(key: str) -> str:
    if key in REMOVED_KEYS:
        return f"{key} was removed: {REMOVED_KEYS[key]}"
    close = difflib.get_close_matches(key, _all_keys(), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else "; see skyrl_train/config/schema.py for the available keys"
    return f"unknown key {key}{hint}"


# ------------------------------------------------------------------------------------------- type coercion


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` converted to the annotation ``tp``; strings are parsed, other values must already fit."""
    origin = get_origin(tp)
    if tp is Any:
        return _untyped(value)
    if origin is Union or origin is types.UnionType:
        return _coerce_union(value, tp, key)
    if value is None:
        raise ConfigError(f"{key}: expected {type_name(tp)}, got null")
    if origin is Literal:
        return _coerce_literal(value, tp, key)
    if origin is list:
        return _coerce_list(value, get_args(tp)[0], key)
    if origin is dict:
        return _coerce_dict(value, get_args(tp)[1], key)
    if tp in (bool, int, float, str):
        return _coerce_scalar(value, tp, key)
    raise ConfigError(f"{key}: fields of type {type_name(tp)} are not supported by the config loader")


def _untyped(value: Any) -> Any:
    """A free-form value with every command-line string inside it parsed as YAML (``5`` → 5, ``x`` → "x")."""
    if isinstance(value, _Raw):
        return _parse_yaml_scalar(value)
    if isinstance(value, Mapping):
        return {k: _untyped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untyped(v) for v in value]
    return value


def _coerce_union(value: Any, tp: Any, key: str) -> Any:
    options = get_args(tp)
    typed_null = isinstance(value, _Raw) and value.strip().lower() in _NULLS
    if (value is None or typed_null) and type(None) in options:
        return None
    for option in options:
        if option is type(None):
            continue
        try:
            return _coerce(value, option, key)
        except ConfigError:
            continue
    raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r}")


def _coerce_literal(value: Any, tp: Any, key: str) -> Any:
    choices = get_args(tp)
    for choice in choices:
        if value == choice and type(value) is type(choice):
            return choice
        if isinstance(value, str) and str(choice) == value:
            return choice
    listed = ", ".join(repr(c) for c in choices)
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"{key}: expected one of {listed}, got {value!r}{hint}")


def _coerce_scalar(value: Any, tp: type, key: str) -> Any:
    if isinstance(value, str):
        return str(value) if tp is str else _parse_scalar(value, tp, key)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is tp:
        return value
    raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")


def _parse_scalar(text: str, tp: type, key: str) -> Any:
    """Parse a string (from the command line, or YAML like ``1e-6`` that YAML 1.1 leaves a string)."""
    stripped = text.strip()
    if tp is bool:
        if stripped.lower() in _TRUE:
            return True
        if stripped.lower() in _FALSE:
            return False
    else:
        try:
            return tp(stripped)
        except ValueError:
            pass
    raise ConfigError(f"{key}: expected {tp.__name__}, got {text!r}")


def _coerce_list(value: Any, item_type: Any, key: str) -> list[Any]:
    if isinstance(value, _Raw):
        value = _parse_raw_list(value)
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"{key}: expected list[{type_name(item_type)}], got {value!r}")
    return [_coerce(item, item_type, f"{key}[{i}]") for i, item in enumerate(value)]


def _parse_raw_list(text: str) -> Any:
    """``[a, b]`` (YAML flow list) or ``a,b`` (comma separated); an empty string is an empty list."""
    stripped = text.strip()
    if stripped.startswith("["):
        return _parse_yaml_scalar(stripped)
    return [_Raw(part.strip()) for part in stripped.split(",")] if stripped else []


def _coerce_dict(value: Any, value_type: Any, key: str) -> dict[str, Any]:
    if isinstance(value, _Raw):
        value = _parse_yaml_scalar(value)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a mapping, got {value!r}")
    result = {}
    for name, item in value.items():
        if not isinstance(name, str):
            raise ConfigError(f"{key}: mapping keys must be strings, got {name!r}")
        result[name] = _coerce(item, value_type, f"{key}.{name}")
    return result


def _parse_yaml_scalar(text: str) -> Any:
    yaml = _yaml()
    try:
        return yaml.safe_load(str(text))
    except yaml.YAMLError:
        return str(text)  # not YAML (e.g. "a: b: c"): keep the text as typed


# ----------------------------------------------------------------------------------- YAML and overrides


def _yaml() -> Any:
    # Imported by name so the type checker does not need PyYAML's stub package; the module is used as ``Any``.
    try:
        return importlib.import_module("yaml")
    except ImportError as exc:  # pragma: no cover - pyyaml is a dependency of skyrl-train
        raise ConfigError("reading YAML configs needs PyYAML: pip install pyyaml") from exc


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``data`` with each ``a.b=c`` override set; values are parsed later by the field's type.

    Keys deeper than ``section.field`` reach into mapping fields
    (``environment.env_configs.text2sql.db_path=/data/db``).

    Raises:
        ConfigError: an override without ``=``, with an empty key, or one that starts with ``+`` or ``~``.
    """
    tree = _deep_copy(data)
    for override in overrides:
        key, sep, value = override.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {override!r} must look like section.field=value")
        if key[0] in "+~":
            raise ConfigError(f"override {override!r}: keys cannot be added or removed, only set (drop {key[0]!r})")
        parts = key.split(".")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(f"override {override!r}: the key must be section.field (e.g. trainer.seed=1)")
        _set_path(tree, parts, _Raw(value))
    return tree


def _set_path(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    node = tree
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {'.'.join(parts)}: {'.'.join(parts[: depth + 1])} is not a mapping")
        node = child
    node[parts[-1]] = value


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read the YAML file at ``path`` (or start from defaults when ``None``), apply ``overrides``, build.

    Raises:
        ConfigError: the file is missing or not a YAML mapping, or a key/value is invalid.
    """
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_yaml(Path(path))
    return from_dict(apply_overrides(data, overrides))


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    yaml = _yaml()
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(loaded).__name__}")
    return loaded


def to_yaml(config: Config) -> str:
    """The config as YAML, sections and fields in declaration order."""
    return str(_yaml().safe_dump(to_dict(config), sort_keys=False, default_flow_style=False))


def record_config(config: Config, run_dir: str | Path, echo: Callable[[str], None] | None = print) -> Path:
    """Print the config as YAML (through ``echo``; ``None`` is silent) and save it as ``{run_dir}/config.yaml``.

    The file is written to a temporary name and renamed, so it is never half written. Returns its path.
    """
    text = to_yaml(config)
    if echo is not None:
        echo(text)
    target = Path(run_dir) / "config.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, target)
    return target
