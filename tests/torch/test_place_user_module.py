"""A placed model whose class lives in the user's own module (next to the script, not
installed) trains on worker processes that cannot import that module: the class travels by
value, as a scheduled function's own modules do."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import convoy as cv
from convoy.testing import TrainingCluster

#: The user's ``common.py``: a model, a parameter-free module and a helper it uses.
COMMON = {
    "common.py": """
        import torch
        from torch import nn

        SCALE = 0.5


        def squash(x):
            return torch.tanh(x) * SCALE


        class Squash(nn.Module):  # holds no parameters: not placed, sent as it is
            def forward(self, x):
                return squash(x)


        class Tower(nn.Module):
            def __init__(self):
                super().__init__()
                self.embedding = nn.Embedding(50, 4)
                self.squash = Squash()
                self.head = nn.Linear(4, 1)

            def forward(self, ids):
                return self.head(self.squash(self.embedding(ids).mean(1))).squeeze(-1)
    """,
}


@pytest.fixture
def common(user_modules):
    """The COMMON module, after checking that a worker's environment cannot import it."""
    (module,) = user_modules(COMMON)
    child = subprocess.run([sys.executable, "-c", "import common"], cwd=os.getcwd(),
                           capture_output=True, text=True, timeout=60)
    assert "ModuleNotFoundError: No module named 'common'" in child.stderr
    return module


@pytest.mark.timeout(120)
def test_a_model_class_from_the_users_module_trains_on_the_workers(common):
    with TrainingCluster(num_workers=1, num_ps=1) as cluster:
        strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        try:
            with strategy.scope():
                torch.manual_seed(0)
                model = cv.torch.place(common.Tower())
                optimizer = cv.optimizers.SGD(0.1)

            def step(ids, labels):
                loss = torch.nn.functional.mse_loss(model(torch.from_numpy(ids)), labels)
                loss.backward()
                optimizer.apply_gradients(model.gradients())
                return type(model).__name__, loss.item()

            rng = np.random.default_rng(0)
            ids = rng.integers(0, 50, (32, 3))
            labels = torch.full((32,), 0.45)
            results = [coordinator.schedule(step, args=(ids, labels)) for _ in range(40)]
            coordinator.join()
            fetched = coordinator.fetch(results)
            assert int(optimizer.iterations.numpy()) == 40
        finally:
            coordinator.shutdown()
    assert {name for name, _ in fetched} == {"Tower"}
    losses = [loss for _, loss in fetched]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) / 2, losses
