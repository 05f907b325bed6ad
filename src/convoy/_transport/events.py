"""One event dispatch for every state machine: each kind of event to its handler.

A state machine handles an event of type ``E`` in its method ``_on_E``; :class:`Handlers`
builds the table from event type to that method once, when the machine's module is imported,
and checks it there: every kind of event the machine declares has a handler, and no handler
waits for an event that is not declared. Applying an event is then one dict lookup. An event
of a kind the machine does not handle is a bug of its caller: :class:`TypeError`, never a
user-facing error.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, Generic, TypeVar

State = TypeVar("State")
Result = TypeVar("Result")

_PREFIX = "_on_"


def event_types(events: Any) -> tuple[type, ...]:
    """The classes of ``events``: a class, a union of classes, or a collection of them."""
    if isinstance(events, type):
        return (events,)
    if typing.get_origin(events) in (types.UnionType, typing.Union):
        return typing.get_args(events)
    return tuple(events)


class Handlers(Generic[State, Result]):
    """The handlers of ``machine`` (a class) for ``events``; each returns a ``Result``."""

    def __init__(self, machine: type[State], events: Any) -> None:
        self.machine = machine.__name__
        kinds = event_types(events)
        self._table: dict[type, Callable[[State, Any], Result]] = {}
        missing = []
        for kind in kinds:
            handler = getattr(machine, _PREFIX + kind.__name__, None)
            if handler is None:
                missing.append(kind.__name__)
            else:
                self._table[kind] = handler
        names = {kind.__name__ for kind in kinds}
        stray = sorted(name for name in dir(machine)
                       if name.startswith(_PREFIX) and name[len(_PREFIX):][:1].isupper()
                       and name[len(_PREFIX):] not in names)
        if missing or stray:
            raise TypeError(f"{self.machine}: no handler for {missing}; handlers of no declared "
                            f"event: {stray}")

    def __call__(self, state: State, event: object) -> Result:
        """Apply ``event`` to ``state`` with its handler; TypeError if it has none."""
        try:
            handler = self._table[type(event)]
        except KeyError:
            raise TypeError(f"{self.machine} has no handler for {type(event).__name__} events"
                            ) from None
        return handler(state, event)
