"""Fixtures of the distribute tests: a cluster of one ps and one worker, and a variable on it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from convoy.distribute._operations import Create
from convoy.distribute._store_clients import remote_store
from convoy.testing import TrainingCluster


@pytest.fixture(scope="module")
def ps_and_worker():
    """A cluster of one ps and one worker, real processes, for the tests of one module."""
    with TrainingCluster(num_workers=1, num_ps=1) as training_cluster:
        yield training_cluster


@pytest.fixture
def table(ps_and_worker, request):
    """A fresh float64 variable of zeros on the ps, of the test module's (ROWS, WIDTH):
    (store, name)."""
    store = remote_store(ps_and_worker.cluster["ps"][0], 0)
    name = f"{request.node.name}-{random.randrange(2**32)}"
    store.execute([Create(name, np.zeros((request.module.ROWS, request.module.WIDTH)))])
    return store, name
