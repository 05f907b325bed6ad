"""Optional: a value that may be absent, as ``get_next_as_optional`` returns it."""

from __future__ import annotations

from typing import Any

from convoy._values import nest
from convoy.errors import InvalidArgumentError


class Optional:
    """Either a value (``from_value``) or nothing (``empty``), with the spec of the value."""

    __slots__ = ("_value", "_has_value", "_spec")

    def __init__(self, value: Any, has_value: bool, element_spec: Any) -> None:
        self._value = value
        self._has_value = has_value
        self._spec = element_spec

    @staticmethod
    def from_value(value: Any) -> Optional:
        """An optional holding ``value``."""
        return Optional(value, True, nest.spec_from_value(value))

    @staticmethod
    def empty(element_spec: Any) -> Optional:
        """An optional with no value, for values of ``element_spec``."""
        return Optional(None, False, element_spec)

    def has_value(self, name: str | None = None) -> bool:
        """Whether a value is present."""
        return self._has_value

    def get_value(self, name: str | None = None) -> Any:
        """The value; InvalidArgumentError when there is none."""
        if not self._has_value:
            raise InvalidArgumentError("The optional variant does not have a value.")
        return self._value

    @property
    def element_spec(self) -> Any:
        return self._spec

    def __repr__(self) -> str:
        return f"Optional({self._value!r})" if self._has_value else "Optional(<empty>)"
