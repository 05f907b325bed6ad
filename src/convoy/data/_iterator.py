"""The iterator over a :class:`~convoy.data.Dataset`, checkpointable as PyTorch's are."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from convoy.data._core._optional import Optional
from convoy.errors import FailedPreconditionError, InvalidArgumentError, OutOfRangeError

if TYPE_CHECKING:
    from convoy.data._dataset import Dataset

_STATE_VERSION = 1


class DatasetIterator:
    """Iterates a dataset; checkpointable with PyTorch's ``state_dict``/``load_state_dict``.

    ``state_dict()`` returns plain picklable data; ``iter(ds).load_state_dict(state)`` yields
    exactly the elements the saved iterator had not yet yielded.
    """

    def __init__(self, dataset: Dataset, key: int, state: dict[str, Any] | None = None) -> None:
        """``state``: start at that position (from ``state_dict()``) rather than the start."""
        if state is not None:
            _check_state(state)
            key = state["key"]
        self._dataset = dataset
        self._key = key
        self._root = dataset._op.iterator(None if state is None else state["root"], key)
        self._next = self._root.gen.__next__

    def __iter__(self) -> DatasetIterator:
        return self

    def __next__(self) -> Any:
        return self._next()

    def get_next(self) -> Any:
        """The next element; raises :class:`OutOfRangeError` at the end."""
        try:
            return self._next()
        except StopIteration:
            raise OutOfRangeError("End of sequence") from None

    def get_next_as_optional(self) -> Optional:
        """The next element as an :class:`Optional`, empty at the end."""
        try:
            return Optional.from_value(self._next())
        except StopIteration:
            return Optional.empty(self._dataset.element_spec if self._spec_known() else None)

    def _spec_known(self) -> bool:
        try:
            _ = self._dataset.element_spec
        except FailedPreconditionError:  # an empty dataset has no spec to give
            return False
        return True

    def state_dict(self) -> dict[str, Any]:
        """The iterator's position as plain picklable data."""
        return {"version": _STATE_VERSION, "key": self._key, "root": self._root.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Move to the position ``state`` (from ``state_dict()`` of an iterator over an equal
        dataset)."""
        _check_state(state)
        root = self._dataset._op.iterator(state["root"], state["key"])
        self._root.close()
        self._root, self._key = root, state["key"]
        self._next = root.gen.__next__

    def close(self) -> None:
        """Stop background threads and close files now rather than when collected."""
        self._root.close()

    def __enter__(self) -> DatasetIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_state(state: Any) -> None:
    if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
        raise InvalidArgumentError(
            "state must be a dict returned by DatasetIterator.state_dict(), got "
            f"{type(state).__name__}"
        )
