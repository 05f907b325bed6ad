"""Coordinated reads (``consumer_index``, ``num_consumers``): the rules every side shares.

In a coordinated read every consumer of a named job gets one element per *round*, and the
elements of a round all come from one worker, so synchronous replicas train on alike
elements at each step. Rounds rotate over the iteration's tasks in turns of
:data:`ROUNDS_PER_TURN` consecutive rounds (so a consumer can fetch many rounds in one call):
round ``r`` is served by task ``(r // ROUNDS_PER_TURN) % len(tasks)`` of the task list, in task
id order. Every consumer must see the same task list, so the dispatcher fixes it when the
iteration gets its first tasks (:func:`adds_tasks`).
"""

from __future__ import annotations

from convoy.data._core._op import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY
from convoy.data.service._common.config import ShardingPolicy, policy_name
from convoy.data.service._common.static_policy import is_static
from convoy.errors import FailedPreconditionError, InvalidArgumentError

#: Consecutive rounds one task serves before the next task takes over.
ROUNDS_PER_TURN = 256


def check_coordinated_job(num_consumers: int, cardinality: int, processing_mode: ShardingPolicy,
                          target_workers: str, cross_trainer_cache: str) -> None:
    """Refuse a coordinated job that cannot keep its consumers in step."""
    if not num_consumers:
        return
    if cardinality not in (INFINITE_CARDINALITY, UNKNOWN_CARDINALITY):
        raise FailedPreconditionError(
            f"Round robin reads require that the input dataset has infinite cardinality, but "
            f"the dataset has cardinality {cardinality}. Consider adding a `.repeat()` "
            f"transformation to the dataset."
        )
    check_coordinated_options(num_consumers, processing_mode, target_workers,
                              cross_trainer_cache)


def check_coordinated_options(num_consumers: int | None, processing_mode: ShardingPolicy,
                              target_workers: str, cross_trainer_cache: str) -> None:
    """Refuse the read options a coordinated read cannot go with."""
    if not num_consumers:
        return
    if is_static(processing_mode):
        # a consumer of a static job reads the workers of its own host: consumers on other
        # hosts would see other workers, and could not agree on whose turn it is
        raise InvalidArgumentError(
            f"Coordinated reads work with OFF and DYNAMIC sharding, not "
            f"{policy_name(processing_mode)}")
    if target_workers == "LOCAL":
        raise InvalidArgumentError(
            'Coordinated reads require non-local workers, but `target_workers` is "LOCAL".')
    if cross_trainer_cache:
        raise InvalidArgumentError("Cross-trainer caching does not support coordinated reads.")


def adds_tasks(fixed_workers: bool, num_tasks: int) -> bool:
    """Whether an iteration with ``num_tasks`` tasks takes a task on a newly seen worker: a
    coordinated iteration (``fixed_workers``) keeps the tasks it started with, so its
    consumers agree on them."""
    return not fixed_workers or num_tasks == 0


def turn_of(round_index: int, num_tasks: int) -> int:
    """The place in the task list of the task serving ``round_index``."""
    return (round_index // ROUNDS_PER_TURN) % num_tasks


def turn_end(round_index: int) -> int:
    """The first round after the turn holding ``round_index``."""
    return (round_index // ROUNDS_PER_TURN + 1) * ROUNDS_PER_TURN


def rounds_served(position: int, num_tasks: int, stop: int) -> int:
    """How many of the rounds ``[0, stop)`` the task at ``position`` of the task list serves."""
    turns, rest = divmod(stop, ROUNDS_PER_TURN)
    cycles, last = divmod(turns, num_tasks)
    return (cycles * ROUNDS_PER_TURN + ROUNDS_PER_TURN * (position < last)
            + rest * (position == last))


def end_of_sequence_error() -> FailedPreconditionError:
    """What a coordinated read fails with when its dataset turns out to be finite."""
    return FailedPreconditionError(
        "Encountered end of sequence on a round-robin read iterator. Please ensure that the "
        "dataset used for round-robin reading has infinite cardinality, e.g. by adding a "
        "`.repeat()` transformation at the end.")
