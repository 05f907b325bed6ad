"""Static sharding on the service's side, as pure rules: whom it admits, each task's shard,
which workers a consumer reads.

The static policies (FILE, DATA, FILE_OR_DATA, HINT) need ``DispatcherConfig.worker_addresses``,
a fixed list of exact ``host:port`` addresses (as each worker reports its own): a worker's
index is its position in the list, and the number of workers its length. With a list, a
worker not on it is refused at its heartbeat; without one, a static job is refused when it is
created. A static job's tasks run on its listed workers only, each on the pipeline rewritten
for its index (:mod:`convoy.data._sharding._static_shard`); a restarted worker starts its
shard again.

A consumer of a static job reads the workers on its own host (``target_workers="AUTO"``; "ANY"
is refused, as in TensorFlow) and is done when they are, so each host reads its own shards
(which workers are on its host is the consumer's to find out:
:mod:`convoy.data.service._client.local_tasks`). The list itself is checked with the
dispatcher's config (:mod:`.server_config`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from convoy.data._core._op import Op
from convoy.data._sharding._static_shard import (
    Rewrite,
    fill_shard_hints,
    shard_data,
    shard_files,
    shard_files_or_data,
    shard_statically,
)
from convoy.data.service._common.config import ShardingPolicy, policy_name
from convoy.errors import FailedPreconditionError, InvalidArgumentError

#: The static sharding policies, each with the rewrite that makes a worker's shard.
REWRITES: dict[ShardingPolicy, Rewrite] = {
    ShardingPolicy.FILE: shard_files, ShardingPolicy.DATA: shard_data,
    ShardingPolicy.FILE_OR_DATA: shard_files_or_data, ShardingPolicy.HINT: fill_shard_hints}
STATIC_POLICIES = frozenset(REWRITES)


def is_static(policy: ShardingPolicy) -> bool:
    """Whether ``policy`` is a static one (each worker reads a fixed shard)."""
    return policy in STATIC_POLICIES


# ----- the dispatcher --------------------------------------------------------------------------
def check_static_job(policy: ShardingPolicy, target_workers: str,
                     worker_addresses: tuple[str, ...]) -> None:
    """Refuse a job under a static ``policy`` without a worker list, or reading any worker."""
    if not is_static(policy):
        return
    if not worker_addresses:
        raise InvalidArgumentError(
            f"sharding policy {policy_name(policy)} needs a fixed list of workers: start the "
            f"dispatcher with DispatcherConfig.worker_addresses (each worker's index is its "
            f"position in the list)"
        )
    if target_workers == "ANY":
        raise InvalidArgumentError(
            f"Static sharding requires reading from local workers: sharding policy "
            f"{policy_name(policy)} cannot be read with target_workers 'ANY'; use 'AUTO'"
        )


def check_listed_worker(worker_addresses: tuple[str, ...] | None, address: str) -> None:
    """Refuse a worker that is not on a configured worker list."""
    if worker_addresses and address not in worker_addresses:
        raise FailedPreconditionError(
            f"worker {address} is not in the dispatcher's worker_addresses "
            f"{list(worker_addresses)}: with a fixed list only the workers on it may join; "
            f"run it at one of those addresses (WorkerConfig port and worker_address) or add "
            f"it to the list"
        )


# ----- the worker --------------------------------------------------------------------------------
def task_shard(policy: ShardingPolicy, num_workers: int, worker_index: int
               ) -> Callable[[Op], Op] | None:
    """What rewrites a task's pipeline into its shard (None: the policy is not static)."""
    rewrite = REWRITES.get(policy)
    if rewrite is None:
        return None
    return functools.partial(shard_statically, rewrite=rewrite, num_workers=num_workers,
                             worker_index=worker_index)


# ----- the consumer ------------------------------------------------------------------------------
def reads_local_workers(policy: ShardingPolicy, target_workers: str) -> bool:
    """Whether a consumer with these options reads only the workers on its own host."""
    return target_workers == "LOCAL" or (is_static(policy) and target_workers == "AUTO")
