"""Parameter-server training: a cluster of ``ps`` and ``worker`` tasks, variables on the
parameter servers, and a coordinator that runs Python functions on the workers."""

from types import SimpleNamespace

from convoy.distribute import cluster_resolver, coordinator, partitioners
from convoy.distribute._dynamic_rows import RowInitializer
from convoy.distribute._dynamic_table import DynamicTable
from convoy.distribute.cluster import ClusterSpec
from convoy.distribute.coordinator import ClusterCoordinator, RemoteValue
from convoy.distribute.server import Server
from convoy.distribute.strategy import (
    InputContext,
    ParameterServerStrategy,
    ReduceOp,
    ShardInfo,
)
from convoy.distribute.variables import ShardedVariable

#: TensorFlow's ``tf.distribute.experimental`` names, so ported code reads the same.
experimental = SimpleNamespace(
    ParameterServerStrategy=ParameterServerStrategy,
    coordinator=coordinator,
    partitioners=partitioners,
)

__all__ = [
    "ClusterCoordinator",
    "ClusterSpec",
    "DynamicTable",
    "InputContext",
    "ParameterServerStrategy",
    "ReduceOp",
    "RemoteValue",
    "RowInitializer",
    "Server",
    "ShardInfo",
    "ShardedVariable",
    "cluster_resolver",
    "coordinator",
    "experimental",
    "partitioners",
]
