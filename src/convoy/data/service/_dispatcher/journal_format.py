"""The journal's record format: events and the dispatcher's state as JSON, never pickles.

An event is the object ``{"kind": <its name in EVENTS>, <field>: <value>, ...}``; a snapshot is
``{"format": FORMAT, "generation": g, "state": <the fields of a SavedState>}``; the journal's
meta file is ``{"format": FORMAT, "id_base": n}``. Values are JSON values, ``bytes`` as base64
strings, dataclasses as objects of their fields. Decoding follows the dataclasses' field types
and refuses anything else with :class:`ValueError`, so a record of another writer is never
half-read. Only kind and field names are stored: moving or renaming a module changes nothing.

Compatible changes keep :data:`FORMAT`: a new event kind, or a new field with a default (older
records lack it and get the default). Anything else needs a new format and a reader of the old.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import json
import types
import typing
from typing import Any

from convoy.data.service._common.config import ShardingPolicy, policy_from_name, policy_name
from convoy.data.service._dispatcher.events import EVENTS, Event, SavedState
from convoy.data.service._dispatcher.state import DispatcherState
from convoy.errors import InvalidArgumentError

#: 2: finished iterations are kept as tombstones, anonymous ones forgotten once unattended and
#: named DYNAMIC ones collected when idle; replaying a journal of format 1 under these rules
#: would hand out other ids than its dispatcher did, so format 1 is refused.
FORMAT = 2

_KINDS = {cls: kind for kind, cls in EVENTS.items()}


@dataclasses.dataclass
class _Snapshot:
    format: int
    generation: int
    state: SavedState


@dataclasses.dataclass
class _Meta:
    format: int
    id_base: int


def encode_event(event: Event) -> bytes:
    return _dumps({"kind": _KINDS[type(event)], **_plain(event)})


def decode_event(data: bytes) -> Event:
    """The event ``data`` encodes; :class:`ValueError` if it encodes none."""
    plain = _loads(data)
    kind = plain.pop("kind", None)
    if not isinstance(kind, str) or kind not in EVENTS:
        raise ValueError(f"unknown record kind {kind!r}; known kinds: {sorted(EVENTS)}")
    event: Event = _build(EVENTS[kind], plain, kind)
    return event


def encode_snapshot(state: DispatcherState, generation: int) -> bytes:
    return _dumps(_plain(_Snapshot(FORMAT, generation, state.saved())))


def decode_snapshot(data: bytes) -> tuple[DispatcherState, int]:
    """The state and log generation of a snapshot; :class:`ValueError` if it is none."""
    snapshot = _build(_Snapshot, _current_format(_loads(data)), "snapshot")
    try:
        return DispatcherState.restore(snapshot.state), snapshot.generation
    except (KeyError, TypeError) as error:
        raise ValueError(f"inconsistent state: no record for {error}") from None


def encode_meta(id_base: int) -> bytes:
    return _dumps(_plain(_Meta(FORMAT, id_base)))


def decode_meta(data: bytes) -> int:
    """The id base a journal's meta record holds; :class:`ValueError` if it holds none."""
    meta: _Meta = _build(_Meta, _current_format(_loads(data)), "meta")
    return meta.id_base


def _current_format(plain: dict[str, Any]) -> dict[str, Any]:
    if plain.get("format") != FORMAT:
        raise ValueError(f"format {plain.get('format')!r}, but this version of convoy reads "
                         f"format {FORMAT} only: start the dispatcher with an empty work_dir "
                         f"(its jobs cannot be restored), or with the version that wrote it")
    return plain


# ----- plain data <-> dataclasses -----------------------------------------------------------------
def _dumps(plain: dict[str, Any]) -> bytes:
    return json.dumps(plain, separators=(",", ":")).encode("ascii")


def _loads(data: bytes) -> dict[str, Any]:
    try:
        plain = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not a JSON record ({error})") from None
    if not isinstance(plain, dict):
        raise ValueError(f"expected a JSON object, got {type(plain).__name__}")
    return plain


def _plain(value: Any) -> Any:
    if isinstance(value, ShardingPolicy):
        return policy_name(value)
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, plain: dict[str, Any], where: str) -> Any:
    types_ = _field_types(cls)
    unknown = sorted(set(plain) - set(types_))
    if unknown:
        raise ValueError(f"{where}: unknown fields {unknown}")
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in plain:
            values[f.name] = _typed(types_[f.name], plain[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{where}: missing field {f.name!r}")
    return cls(**values)


def _typed(kind: Any, value: Any, where: str) -> Any:
    """``value`` as the type ``kind``, or :class:`ValueError`."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):  # only ``X | None`` is used
        return None if value is None else _typed(args[0], value, where)
    if kind is ShardingPolicy and isinstance(value, str):
        try:
            return policy_from_name(value)
        except InvalidArgumentError as error:
            raise ValueError(f"{where}: {error}") from None
    if kind is bytes and isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error:
            pass
    elif kind is float and type(value) in (int, float):
        return float(value)
    elif kind in (int, str, bool) and type(value) is kind:
        return value
    elif origin in (tuple, list) and isinstance(value, list):
        items = [_typed(args[0], item, f"{where}[{i}]") for i, item in enumerate(value)]
        return tuple(items) if origin is tuple else items
    elif origin is dict and isinstance(value, dict):
        return {_typed(args[0], key, where): _typed(args[1], item, f"{where}[{key!r}]")
                for key, item in value.items()}
    elif isinstance(kind, type) and dataclasses.is_dataclass(kind) and isinstance(value, dict):
        return _build(kind, value, where)
    shown = repr(value)
    raise ValueError(f"{where}: expected {kind}, got {shown[:60]}")
