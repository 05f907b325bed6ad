"""Equal shares ride through a fault-tolerant dispatcher's restart mid-epoch: the readers'
reports rebuild the shares, both ranks take as many elements, each element once ("pad" adds
at most one copy)."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

import pytest

import convoy as cv
from convoy.testing import ProcessCluster, ServerProcess

N = 400


def _read(face: cv.torch.IterableDataset, out: list[int], errors: list[BaseException]) -> None:
    """Read ``face``'s pass slowly into ``out``."""
    try:
        for element in face:
            out.append(int(element))
            time.sleep(0.005)
    except BaseException as error:  # reported by the test
        errors.append(error)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_equal_shares_survive_a_dispatcher_restart_mid_epoch(tmp_path: Path) -> None:
    args = ["--work-dir", str(tmp_path), "--fault-tolerant"]
    with ProcessCluster(num_workers=2, dispatcher_args=args) as cluster:
        ds = cv.data.Dataset.range(N).apply(cv.data.service.distribute(
            "distributed_epoch", cluster.target, job_name="restart"))
        seen: list[list[int]] = [[], []]
        errors: list[BaseException] = []
        readers = [threading.Thread(target=_read, args=(
            cv.torch.IterableDataset(ds, rank=rank, world_size=2), seen[rank], errors))
            for rank in range(2)]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 60
        while len(seen[0]) + len(seen[1]) < N // 3:
            assert time.monotonic() < deadline, "the readers did not reach a third of the epoch"
            time.sleep(0.05)
        port = cluster.dispatcher.address.rsplit(":", 1)[1]
        cluster.dispatcher.kill()
        assert all(reader.is_alive() for reader in readers), "the epoch ended before the kill"
        cluster.dispatcher = ServerProcess("dispatcher", ["--port", port, *args]).start()
        for reader in readers:
            reader.join(90)
        assert not any(reader.is_alive() for reader in readers), "a reader hung"
    assert not errors, errors
    assert len(seen[0]) == len(seen[1])
    counts = collections.Counter(seen[0] + seen[1])
    assert set(counts) == set(range(N))
    assert sum(counts.values()) - N <= 1
