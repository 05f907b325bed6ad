"""One cluster for every ported TensorFlow test that needs parameter servers or workers and
kills none: 3 ps and 2 workers in their own processes, started once. ``resolver(num_ps)``
sees only the first ``num_ps`` parameter servers, so a test written for a 2-ps cluster runs on
the same one."""

from __future__ import annotations

import pytest

import convoy as cv
from convoy.testing import TrainingCluster


@pytest.fixture(scope="session")
def ps_cluster():
    with TrainingCluster(num_workers=2, num_ps=3) as cluster:
        yield cluster


@pytest.fixture
def resolver(ps_cluster):
    def make(num_ps: int = 3):
        spec = dict(ps_cluster.cluster, ps=ps_cluster.cluster["ps"][:num_ps])
        return cv.distribute.cluster_resolver.SimpleClusterResolver(
            cv.distribute.ClusterSpec(spec), task_type="chief", task_id=0)

    return make
