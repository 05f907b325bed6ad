"""Equal shares of a distributed dataset read by loader workers that come and go every epoch
(not persistent), with and without ``set_epoch``, epoch after epoch, for several numbers of
ranks (threads of this process, each with its own DataLoader): never a crashed or empty epoch,
every rank as many elements, each element once (but for the padding). ``CONVOY_STRESS=n``
runs ``n`` times as many epochs."""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Iterator

import pytest
from torch.utils.data import DataLoader

import convoy as cv
from convoy.errors import FailedPreconditionError
from convoy.testing import InProcessCluster

#: Loader workers start from a fork server (see conftest.py)
LOADER_CONTEXT = "forkserver"
EPOCHS = 3 * int(os.environ.get("CONVOY_STRESS", "1"))
ELEMENTS = 41

service = cv.data.service


@pytest.fixture(scope="module")
def cluster() -> Iterator[InProcessCluster]:
    with InProcessCluster(num_workers=2) as cluster:
        yield cluster


def _faces(cluster: InProcessCluster, name: str, world_size: int) -> list[cv.torch.IterableDataset]:
    ds = cv.data.Dataset.range(ELEMENTS).apply(service.distribute(
        service.ShardingPolicy.DYNAMIC, cluster.target, job_name=name,
        dispatcher_timeout_ms=30_000))
    return [cv.torch.IterableDataset(ds, rank=rank, world_size=world_size,
                                     equal_shares="pad") for rank in range(world_size)]


def _read_together(loaders: list[DataLoader]) -> list[list[int]]:
    """One pass of each rank's loader, the ranks at once (as DDP's would be)."""
    seen: list[list[int]] = [[] for _ in loaders]
    errors: list[BaseException] = []

    def read(rank: int) -> None:
        try:
            seen[rank] = [int(x) for x in loaders[rank]]
        except BaseException as error:  # raised again in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=read, args=(rank,)) for rank in range(len(loaders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a rank's epoch hung"
    if errors:
        raise errors[0]
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("set_epoch", [True, False])
@pytest.mark.parametrize("world_size", [1, 2])
def test_equal_shares_with_workers_that_come_and_go(cluster: InProcessCluster, world_size: int,
                                                     set_epoch: bool) -> None:
    faces = _faces(cluster, f"stress-{world_size}-{set_epoch}", world_size)
    loaders = [DataLoader(face, batch_size=None, num_workers=2, persistent_workers=False,
                          multiprocessing_context=LOADER_CONTEXT) for face in faces]
    for epoch in range(EPOCHS):
        if set_epoch:
            for face in faces:
                face.set_epoch(epoch)
        seen = _read_together(loaders)
        share = -(-ELEMENTS // world_size)
        assert [len(s) for s in seen] == [share] * world_size, (epoch, seen)
        counts = collections.Counter(x for s in seen for x in s)
        assert set(counts) == set(range(ELEMENTS)), epoch
        assert sum(counts.values()) - ELEMENTS == share * world_size - ELEMENTS


@pytest.mark.timeout(60)
def test_an_epoch_read_again_fails_naming_set_epoch(cluster: InProcessCluster) -> None:
    (face,) = _faces(cluster, "stress-again", 1)
    data = DataLoader(face, batch_size=None, num_workers=0)
    face.set_epoch(0)
    assert sorted(int(x) for x in data) == list(range(ELEMENTS))
    with pytest.raises(FailedPreconditionError, match="read to its end.*set_epoch"):
        list(data)  # set_epoch(0) still: the same epoch again
