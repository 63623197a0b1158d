"""JSON to dataclasses and back, by their type hints: the one place that knows how the
protocol's objects map to Python values."""

from __future__ import annotations

import dataclasses
import enum
import functools
import typing
from typing import Any, Dict, Type, TypeVar, Union

T = TypeVar("T")

_NONE = type(None)


class Wire:
    """Base of the protocol's dataclasses.

    ``NULLABLE`` names the fields written as ``null`` when ``None`` (the others are left
    out); ``OMIT_DEFAULT`` those left out when they hold their default; ``STRICT`` refuses
    an object with fields the class does not know (as the daemon does for it).
    """

    NULLABLE: typing.ClassVar[frozenset[str]] = frozenset()
    OMIT_DEFAULT: typing.ClassVar[frozenset[str]] = frozenset()
    STRICT: typing.ClassVar[bool] = False

    @classmethod
    def from_json(cls: Type[T], value: Any) -> T:
        return _decode_dataclass(cls, value)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if value is None:
                if field.name in self.NULLABLE:
                    out[field.name] = None
                continue
            if field.name in self.OMIT_DEFAULT and value == _default(field):
                continue
            out[field.name] = encode(value)
        return out


class Tagged(Wire):
    """Base of the protocol's objects tagged by ``kind``: ``KINDS`` maps each kind to the
    fields it requires and those it may have; ``CLOSED`` refuses other kinds (a newer
    daemon's kind otherwise keeps its name and the fields this client knows)."""

    KINDS: typing.ClassVar[Dict[str, typing.Tuple[typing.Tuple[str, ...], typing.Tuple[str, ...]]]] = {}
    CLOSED: typing.ClassVar[bool] = False

    @classmethod
    def from_json(cls: Type[T], value: Any) -> T:
        kinds = cls.KINDS  # type: ignore[attr-defined]
        kind = value.get("kind") if isinstance(value, dict) else None
        if not isinstance(kind, str) or (cls.CLOSED and kind not in kinds):  # type: ignore[attr-defined]
            raise ValueError(f"{cls.__name__} of unknown kind: {value!r}")
        for name in kinds.get(kind, ((), ()))[0]:
            if name not in value:
                raise ValueError(f"{cls.__name__} {kind!r}: missing field {name!r}")
        return _decode_dataclass(cls, value)

    def to_json(self) -> Dict[str, Any]:
        kind = getattr(self, "kind")
        if kind not in self.KINDS:
            return Wire.to_json(self)
        required, optional = self.KINDS[kind]
        out: Dict[str, Any] = {"kind": kind}
        for name in required:
            out[name] = encode(getattr(self, name))
        for name in optional:
            if getattr(self, name) is not None:
                out[name] = encode(getattr(self, name))
        return out


def _default(field: dataclasses.Field) -> Any:  # type: ignore[type-arg]
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return field.default


def encode(value: Any) -> Any:
    """A value as JSON: dataclasses through their ``to_json``, enums by value."""
    if isinstance(value, Wire) or hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    return value


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> Dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode_dataclass(cls: Type[T], value: Any) -> T:
    if not isinstance(value, dict):
        raise ValueError(f"{cls.__name__}: expected an object, got {value!r}")
    if getattr(cls, "STRICT", False):
        unknown = set(value) - {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    hints = _hints(cls)
    kwargs = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.name in value:
            kwargs[field.name] = decode(hints[field.name], value[field.name], field.name)
        elif _default(field) is dataclasses.MISSING:
            raise ValueError(f"{cls.__name__}: missing field {field.name!r}")
    return cls(**kwargs)


def decode(tp: Any, value: Any, where: str = "value") -> Any:
    """``value`` (parsed JSON) as the type ``tp``, checked."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if origin is Union:
        if value is None and _NONE in args:
            return None
        (inner,) = [a for a in args if a is not _NONE]
        return decode(inner, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        return [decode(args[0], v, where) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {value!r}")
        return {k: decode(args[1], v, where) for k, v in value.items()}
    if isinstance(tp, type) and hasattr(tp, "from_json"):
        return tp.from_json(value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if tp is int and (type(value) is not int):
        raise ValueError(f"{where}: expected an integer, got {value!r}")
    if tp in (str, bool) and type(value) is not tp:
        raise ValueError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value
