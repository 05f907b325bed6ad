"""The data service: run a pipeline on a fleet of worker processes and stream its elements
to trainers.

A :class:`DispatchServer` keeps track of datasets, jobs and workers; :class:`WorkerServer`
processes run the pipelines; trainers read with :func:`distribute` or
:func:`register_dataset` + :func:`from_dataset_id`. :class:`LocalCluster` runs a dispatcher
and workers as processes on this machine, sized by hand or by the dispatcher's estimate.
"""

from convoy.data.service._client.options import CrossTrainerCache
from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._common.server_config import DispatcherConfig, WorkerConfig
from convoy.data.service._dispatch_server import DispatchServer
from convoy.data.service._distribute import distribute, from_dataset_id, register_dataset
from convoy.data.service._local_cluster import LocalCluster
from convoy.data.service._worker_server import WorkerServer

__all__ = [
    "CrossTrainerCache",
    "DispatchServer",
    "DispatcherConfig",
    "LocalCluster",
    "ShardingPolicy",
    "WorkerConfig",
    "WorkerServer",
    "distribute",
    "from_dataset_id",
    "register_dataset",
]
