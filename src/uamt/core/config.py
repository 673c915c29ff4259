"""params.yaml -> frozen dataclasses, one section per pipeline stage.

Each stage module defines its own frozen dataclass and reads its section with
:func:`load_section`.  Unknown keys and wrong types raise :class:`ConfigError` naming the
file, the section and the key, so a typo in ``params.yaml`` never silently falls back to a
default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

DEFAULT_PARAMS = Path("params.yaml")


class ConfigError(ValueError):
    """A params file, section or key is missing, unknown or of the wrong type."""


def read_params(path: str | Path = DEFAULT_PARAMS, what: str = "params file") -> dict[str, Any]:
    """Read a YAML file of sections (``what``: how errors call it) into a dict, with a clear error
    when it is missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: {what} not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; convert lists to tuples and nested dicts to dataclasses."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in args:
            try:
                return _coerce(value, option, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{where}: expected null, got {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise ConfigError(f"{where}: {value!r} not supported; choose from {sorted(map(str, args))}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return _build(tp, value, where)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r} ({type(value).__name__})")
        item_tp = args[0] if args else Any
        return tuple(_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        key_tp, val_tp = args if args else (Any, Any)
        return {
            _coerce(k, key_tp, f"{where}.{k}"): _coerce(v, val_tp, f"{where}.{k}") for k, v in value.items()
        }
    if tp is float:
        # YAML writes 1 for 1.0; bool is an int subclass and must not pass as a number.
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected float, got {value!r} ({type(value).__name__})")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected int, got {value!r} ({type(value).__name__})")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected str, got {value!r} ({type(value).__name__})")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected bool, got {value!r} ({type(value).__name__})")
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")
    return value


def _build(cls: type[T], values: dict[str, Any], where: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known keys are {sorted(fields)}")
    kwargs = {}
    for name, field in fields.items():
        if name in values:
            kwargs[name] = _coerce(values[name], hints[name], f"{where}.{name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}: required key {name!r} is missing")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as exc:  # a check of the class's own (__post_init__): name where the values came from
        raise ConfigError(f"{where}: {exc}") from exc


def check_names(names: Sequence[str], known: Iterable[str], what: str, *, allow_empty: bool = True) -> tuple[str, ...]:
    """``names`` as a tuple; ValueError listing the choices when one is unknown or repeated (or, without
    ``allow_empty``, when there is none).  ``what`` names one item in the messages (``reference``)."""
    names, known = tuple(names), set(known)
    if not names and not allow_empty:
        raise ValueError(f"{what} set is empty; choose from {sorted(known)}")
    for name in names:
        if name not in known:
            raise ValueError(f"{what}={name!r} not supported; choose from {sorted(known)}")
    repeated = [name for k, name in enumerate(names) if name in names[:k]]
    if repeated:
        raise ValueError(f"{what} set {list(names)} names {repeated[0]!r} twice")
    return names


def from_dict(cls: type[T], values: dict[str, Any] | None, where: str = "params") -> T:
    """Build the frozen dataclass ``cls`` from a plain mapping, validating keys and types.

    A section given as anything but a mapping (a YAML list, a number, a string) is refused as such,
    rather than reported key by key.
    """
    if values is None:
        values = {}
    if not isinstance(values, dict):
        shown = repr(values)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ConfigError(
            f"{where}: must be a mapping of key: value pairs, got a {type(values).__name__} ({shown})"
        )
    return _build(cls, values, where)


def load_section(cls: type[T], section: str, path: str | Path = DEFAULT_PARAMS) -> T:
    """Read ``section`` of the params file at ``path`` into the frozen dataclass ``cls``.

    Raises
    ------
    ConfigError
        If the file or section is missing, a key is unknown or a value has the wrong type;
        the message names ``<file>:<section>.<key>``.
    """
    params = read_params(path)
    if section not in params:
        raise ConfigError(f"{path}: section {section!r} is missing; sections present: {sorted(params)}")
    return from_dict(cls, params[section], where=f"{path}:{section}")
