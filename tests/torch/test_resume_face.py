"""Training resumes where it stopped: ``convoy.torch.IterableDataset`` saves its pass and
position (alone, in a ``cv.train.Checkpoint`` with a model and optimizer, or per loader worker
through torchdata's ``StatefulDataLoader``), over local pipelines and the data service."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import convoy as cv
from convoy.testing import InProcessCluster

#: Loader workers start from a fork server (see conftest.py)
LOADER_CONTEXT = "forkserver"

service = cv.data.service


@pytest.fixture(scope="module")
def cluster() -> Iterator[InProcessCluster]:
    with InProcessCluster(num_workers=2) as cluster:
        yield cluster


def _pipeline(kind: str, cluster: InProcessCluster) -> cv.data.Dataset:
    ds = cv.data.Dataset.range(600).shuffle(100, seed=5)
    if kind == "local":
        return ds.batch(10)
    return ds.apply(service.distribute(kind, cluster.target)).batch(10)


def _ids(batch: Any) -> list[int]:
    return [int(x) for x in batch]


@pytest.mark.parametrize("kind", ["local", "off", "dynamic"])
def test_checkpoint_saves_model_optimizer_and_data_position(
        kind: str, cluster: InProcessCluster, tmp_path: Path) -> None:
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    it = iter(_pipeline(kind, cluster))
    checkpoint = cv.train.Checkpoint(model=model, optimizer=optimizer, iterator=it)
    seen = [n for _ in range(17) for n in _ids(next(it))]
    path = checkpoint.save(tmp_path / "ckpt")
    saved_weight = model.weight.detach().clone()
    it.close()

    model2 = torch.nn.Linear(1, 1)
    optimizer2 = torch.optim.SGD(model2.parameters(), lr=0.1)
    it2 = iter(_pipeline(kind, cluster))
    cv.train.Checkpoint(model=model2, optimizer=optimizer2, iterator=it2).restore(
        path).assert_consumed()
    assert torch.equal(model2.weight, saved_weight)
    rest = [n for batch in it2 for n in _ids(batch)]
    assert sorted(seen + rest) == sorted(list(range(600)) * (2 if kind == "off" else 1))


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize("kind", ["local", "dynamic"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_the_face(kind: str, num_workers: int,
                                              cluster: InProcessCluster) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader",
                                   reason="torchdata is not installed")

    def loader() -> Any:
        face = cv.torch.IterableDataset(_pipeline(kind, cluster))
        return stateful.StatefulDataLoader(
            face, batch_size=None, num_workers=num_workers,
            multiprocessing_context=LOADER_CONTEXT if num_workers else None)

    first = loader()
    batches = iter(first)
    trained = [n for _ in range(23) for n in _ids(next(batches))]
    state = first.state_dict()
    del batches, first  # the training stops (its loader workers with it)

    again = loader()
    again.load_state_dict(state)
    rest = [n for batch in again for n in _ids(batch)]
    assert sorted(trained + rest) == list(range(600))



@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize(("num_workers", "every"), [(0, 1), (2, 1), (2, 7)])
def test_stateful_dataloader_resumes_equal_shares_mid_epoch_and_between(
        num_workers: int, every: int, cluster: InProcessCluster) -> None:
    """Equal shares (here of one rank) save the elements their readers took ahead and the
    counts the dispatcher rebuilds the shares from; resumed twice from one state (the first
    resume dies), the same; saved between epochs, the next epoch whole. (Saved before the
    readers saw the job's end: see docs/pytorch.md on saving at the end of an epoch.)"""
    stateful = pytest.importorskip("torchdata.stateful_dataloader",
                                   reason="torchdata is not installed")
    pipeline = cv.data.Dataset.range(3000).apply(service.distribute(
        "dynamic", cluster.target)).batch(10)

    def loader(state: dict[str, Any] | None, epoch: int = 0) -> Any:
        face = cv.torch.IterableDataset(pipeline, rank=0, world_size=1, equal_shares="pad")
        face.set_epoch(epoch)
        data = stateful.StatefulDataLoader(
            face, batch_size=None, num_workers=num_workers, snapshot_every_n_steps=every,
            multiprocessing_context=LOADER_CONTEXT if num_workers else None)
        if state is not None:
            data.load_state_dict(state)
        return data

    first = loader(None)
    batches = iter(first)
    trained = [n for _ in range(23) for n in _ids(next(batches))]
    state = first.state_dict()
    del batches, first  # the training stops (its loader workers with it)
    dies = iter(loader(state))
    assert len([next(dies) for _ in range(3)]) == 3
    del dies
    again = loader(state)
    rest = [n for batch in again for n in _ids(batch)]
    assert sorted(trained + rest) == list(range(3000))
    between = again.state_dict()
    del again
    # (the loader starts workers with the saved states, then others for the next epoch)
    assert sorted(n for b in loader(between, 1) for n in _ids(b)) == list(range(3000))
