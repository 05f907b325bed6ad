"""Functions from the user's own modules run on worker processes that cannot import them: the
modules travel by value, for data-service pipelines and for scheduled training functions."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import convoy as cv
from convoy.testing import ProcessCluster, TrainingCluster

#: The user's package: a step function, and a helper module whose class and constant it uses.
FEATURES = {
    "features/__init__.py": "",
    "features/helpers.py": """
        import numpy as np

        OFFSET = 1000


        class Scale:
            def __init__(self, factor):
                self.factor = factor

            def __call__(self, x):
                return np.int64(x) * self.factor
    """,
    "features/steps.py": """
        from . import helpers


        def scaled_and_shifted(x):
            return helpers.Scale(3)(x) + helpers.OFFSET


        def add_scaled(total, x):
            total.assign_add(float(helpers.Scale(3)(x)))
            return helpers.Scale(x)
    """,
}


@pytest.fixture
def features(user_modules):
    """The FEATURES modules (helpers, steps), after checking that a worker's environment
    cannot import them."""
    _, helpers, steps = user_modules(FEATURES)
    assert str(user_modules.root) not in os.environ.get("PYTHONPATH", "")
    child = subprocess.run([sys.executable, "-c", "import features.steps"], cwd=os.getcwd(),
                           capture_output=True, text=True, timeout=60)
    assert "ModuleNotFoundError: No module named 'features'" in child.stderr
    return helpers, steps


@pytest.mark.timeout(120)
def test_a_pipeline_maps_a_function_from_the_users_module(features):
    helpers, steps = features
    with ProcessCluster(num_workers=1) as cluster:
        dataset = (cv.data.Dataset.range(10).map(steps.scaled_and_shifted)
                   .map(helpers.Scale(2))  # an object of the user's class in the graph
                   .apply(cv.data.service.distribute("parallel_epochs", cluster.target)))
        elements = [int(x) for x in dataset]
    assert sorted(elements) == [2 * (3 * x + 1000) for x in range(10)]


@pytest.mark.timeout(120)
def test_a_scheduled_function_from_the_users_module(features):
    helpers, steps = features
    with TrainingCluster(num_workers=1, num_ps=1) as cluster:
        strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        try:
            with strategy.scope():
                total = cv.Variable(np.zeros(()), name="total")
            results = [coordinator.schedule(steps.add_scaled, args=(total, x))
                       for x in range(1, 5)]
            coordinator.join()
            scales = coordinator.fetch(results)
            assert float(total.numpy()) == 3 * (1 + 2 + 3 + 4)
        finally:
            coordinator.shutdown()
    assert all(isinstance(scale, helpers.Scale) for scale in scales)  # the class came back
    assert [scale.factor for scale in scales] == [1, 2, 3, 4]
