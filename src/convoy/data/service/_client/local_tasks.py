"""Which workers are on the consumer's own host: a consumer of a static job (or with
``target_workers="LOCAL"``) reads only those (:mod:`convoy.data.service._common.static_policy`
holds the rule; this module looks up the host)."""

from __future__ import annotations

import functools
import socket

from convoy.data.service._client.reader_events import ListedTask
from convoy.data.service._common.config import ShardingPolicy, policy_name
from convoy.data.service._common.static_policy import is_static
from convoy.errors import ConvoyError, FailedPreconditionError, InvalidArgumentError


@functools.cache
def _local_hosts() -> frozenset[str]:
    hosts = {"localhost", "::1", socket.gethostname().lower()}
    try:
        hosts.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass  # an unresolvable host name: it still counts by name
    return frozenset(hosts)


def is_local_address(address: str) -> bool:
    """Whether the worker at ``address`` ("host:port") runs on this host."""
    host = address.rsplit(":", 1)[0].strip("[]").lower()
    return host.startswith("127.") or host in _local_hosts()


class LocalTasks:
    """Narrows a consumer's view of its iteration to the tasks on its own host (for a static
    ``policy`` or ``target_workers="LOCAL"``)."""

    def __init__(self, policy: ShardingPolicy = ShardingPolicy.OFF,
                 target_workers: str = "AUTO") -> None:
        self.policy = policy
        self.target_workers = target_workers
        self.seen = False  # a task on this host has been listed

    def view(self, tasks: tuple[ListedTask, ...], iteration_finished: bool
             ) -> tuple[tuple[ListedTask, ...], bool]:
        """The unfinished ``tasks`` (task id, worker address) on this host, and whether the
        reading is done: when the iteration is, or when this host's tasks, once listed, have
        all finished (the other hosts' shards are their own consumers' to read). Raises if
        the dispatcher lists tasks, none of them ever on this host."""
        local = tuple(task for task in tasks if is_local_address(task[1]))
        if tasks and not local and not self.seen and not iteration_finished:
            raise self._no_local_worker(sorted({task[1] for task in tasks}))
        self.seen = self.seen or bool(local)
        return local, iteration_finished or (self.seen and not local)

    def _no_local_worker(self, elsewhere: list[str]) -> ConvoyError:
        host = socket.gethostname()
        if self.target_workers != "LOCAL":
            return FailedPreconditionError(
                f"static sharding reads the workers on the consumer's own host ({host}), but "
                f"the job's workers are all elsewhere: {elsewhere}; run a worker on each host "
                f"that reads (worker_addresses lists them)")
        what = (f"Static sharding policy {policy_name(self.policy)} requires"
                if is_static(self.policy) else "Local reads require")
        return InvalidArgumentError(
            f"{what} local convoy data service workers, but no local worker is found: "
            f"target_workers='LOCAL' reads the workers on this host ({host}), and the job's "
            f"workers are all elsewhere: {elsewhere}; run a convoy worker on this host")
