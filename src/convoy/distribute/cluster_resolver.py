"""Cluster resolvers: where a process learns the cluster layout and its own place in it.

* :class:`SimpleClusterResolver` wraps a :class:`ClusterSpec` given in code.
* :class:`TFConfigClusterResolver` reads the ``TF_CONFIG`` environment variable, using the same
  JSON layout as TensorFlow::

      {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"], "ps": ["host2:2222"]},
       "task": {"type": "worker", "index": 0},
       "rpc_layer": "grpc"}
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Mapping
from typing import Any

from convoy.distribute.cluster import ClusterSpec
from convoy.errors import InvalidArgumentError

__all__ = [
    "ClusterResolver",
    "SimpleClusterResolver",
    "TFConfigClusterResolver",
    "TF_CONFIG",
    "format_master_url",
]

#: The environment variable :class:`TFConfigClusterResolver` reads.
TF_CONFIG = "TF_CONFIG"


def format_master_url(address: str, rpc_layer: str | None = None) -> str:
    """``"rpc_layer://address"``, or ``address`` alone when there is no rpc layer or address."""
    if rpc_layer and address:
        return f"{rpc_layer}://{address}"
    return address


def _task_type(value: Any, source: str = "task_type") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(
            f"{source} must be a non-empty string such as 'worker', got {value!r}"
        )
    return value


def _task_id(value: Any, source: str = "task_id") -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdecimal():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{source} must be an integer >= 0, got {value!r}")
    return value


def _rpc_layer(value: Any, source: str = "rpc_layer") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{source} must be a string such as 'grpc', got {value!r}")
    return value


class ClusterResolver(abc.ABC):
    """Base class: tells a process the cluster spec, its own task and the RPC protocol."""

    def __init__(self, task_type: str | None = None, task_id: int | None = None,
                 rpc_layer: str | None = None, environment: str | None = None) -> None:
        self._task_type = _task_type(task_type)
        self._task_id = _task_id(task_id)
        self._rpc_layer = _rpc_layer(rpc_layer)
        self._environment = environment

    @abc.abstractmethod
    def cluster_spec(self) -> ClusterSpec:
        """The cluster this process belongs to (empty when there is none)."""

    @property
    def task_type(self) -> str | None:
        """This process's job name (``"chief"``, ``"worker"``, ``"ps"``, ...), if known."""
        return self._task_type

    @task_type.setter
    def task_type(self, value: str | None) -> None:
        self._task_type = _task_type(value)

    @property
    def task_id(self) -> int | None:
        """This process's index within its job, if known."""
        return self._task_id

    @task_id.setter
    def task_id(self, value: int | None) -> None:
        self._task_id = _task_id(value)

    @property
    def rpc_layer(self) -> str | None:
        """The RPC protocol used to reach the tasks (``"grpc"``), if any."""
        return self._rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, value: str | None) -> None:
        self._rpc_layer = _rpc_layer(value)

    @property
    def environment(self) -> str | None:
        """A free-form name of the environment the cluster runs in (informational)."""
        return self._environment

    def master(self, task_type: str | None = None, task_id: int | None = None,
               rpc_layer: str | None = None) -> str:
        """The URL of a task (this one by default), prefixed with the rpc layer; ``''`` if none."""
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        if task_type is None or task_id is None:
            return ""
        address = self.cluster_spec().task_address(task_type, task_id)
        return format_master_url(address, self.rpc_layer if rpc_layer is None else rpc_layer)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(cluster_spec={self.cluster_spec()!r}, "
                f"task_type={self.task_type!r}, task_id={self.task_id!r}, "
                f"rpc_layer={self.rpc_layer!r})")


class SimpleClusterResolver(ClusterResolver):
    """A resolver over a cluster spec given in code (e.g. an in-process test cluster)."""

    def __init__(self, cluster_spec: ClusterSpec | Mapping[str, Any],
                 task_type: str | None = None, task_id: int | None = None,
                 rpc_layer: str | None = "grpc", master: str = "",
                 environment: str = "") -> None:
        super().__init__(task_type, task_id, rpc_layer, environment)
        self._cluster_spec = (cluster_spec if isinstance(cluster_spec, ClusterSpec)
                              else ClusterSpec(cluster_spec))
        if not isinstance(master, str):
            raise InvalidArgumentError(f"master must be a string, got {master!r}")
        self._master = master

    def cluster_spec(self) -> ClusterSpec:
        return self._cluster_spec

    def master(self, task_type: str | None = None, task_id: int | None = None,
               rpc_layer: str | None = None) -> str:
        """The address of ``task_type``/``task_id`` if both are given, else the ``master`` arg."""
        if task_type is not None and task_id is not None:
            address = self._cluster_spec.task_address(task_type, task_id)
        else:
            address = self._master
        return format_master_url(address, rpc_layer or self.rpc_layer)


def _load_tf_config() -> dict[str, Any]:
    raw = os.environ.get(TF_CONFIG, "")
    if not raw.strip():
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise InvalidArgumentError(
            f"the {TF_CONFIG} environment variable is not valid JSON ({error}): {raw!r}"
        ) from None
    if not isinstance(config, dict):
        raise InvalidArgumentError(
            f"{TF_CONFIG} must hold a JSON object with keys 'cluster', 'task' and optionally "
            f"'rpc_layer', got {type(config).__name__}: {raw!r}"
        )
    for key in ("cluster", "task"):
        if key in config and not isinstance(config[key], dict):
            raise InvalidArgumentError(
                f"{TF_CONFIG}[{key!r}] must be a JSON object, got {config[key]!r}"
            )
    task = config.get("task")
    if task and "type" not in task:
        raise InvalidArgumentError(
            f"{TF_CONFIG}['task'] must name the task's job under 'type' (and its index under "
            f"'index'), got {task!r}"
        )
    return config


class TFConfigClusterResolver(ClusterResolver):
    """A resolver that reads ``TF_CONFIG`` (JSON) from the environment on every query.

    Arguments given here override the corresponding ``TF_CONFIG`` entries; so do the
    ``task_type``/``task_id``/``rpc_layer`` setters. Without ``TF_CONFIG`` the cluster spec is
    empty and the task is unknown.
    """

    def __init__(self, task_type: str | None = None, task_id: int | None = None,
                 rpc_layer: str | None = None, environment: str | None = None) -> None:
        super().__init__(task_type, task_id, rpc_layer, environment)

    def cluster_spec(self) -> ClusterSpec:
        cluster = _load_tf_config().get("cluster")
        if not cluster:
            return ClusterSpec({})
        try:
            return ClusterSpec(cluster)
        except InvalidArgumentError as error:
            raise InvalidArgumentError(f"{TF_CONFIG}['cluster'] is malformed: {error}") from None

    @property
    def task_type(self) -> str | None:
        if self._task_type is not None:
            return self._task_type
        task = _load_tf_config().get("task") or {}
        return _task_type(task.get("type"), f"{TF_CONFIG}['task']['type']")

    @task_type.setter
    def task_type(self, value: str | None) -> None:
        self._task_type = _task_type(value)

    @property
    def task_id(self) -> int | None:
        if self._task_id is not None:
            return self._task_id
        task = _load_tf_config().get("task") or {}
        return _task_id(task.get("index"), f"{TF_CONFIG}['task']['index']")

    @task_id.setter
    def task_id(self, value: int | None) -> None:
        self._task_id = _task_id(value)

    @property
    def rpc_layer(self) -> str | None:
        if self._rpc_layer is not None:
            return self._rpc_layer
        return _rpc_layer(_load_tf_config().get("rpc_layer"), f"{TF_CONFIG}['rpc_layer']")

    @rpc_layer.setter
    def rpc_layer(self, value: str | None) -> None:
        self._rpc_layer = _rpc_layer(value)

    def master(self, task_type: str | None = None, task_id: int | None = None,
               rpc_layer: str | None = None) -> str:
        """``TF_CONFIG``'s ``session_master`` if set; ``''`` for a one-task (or empty) cluster;
        else the URL of the given task (this one by default)."""
        config = _load_tf_config()
        if config.get("session_master") is not None:
            return str(config["session_master"])
        spec = self.cluster_spec()
        if not spec.jobs or (len(spec.jobs) == 1 and len(spec.job_tasks(spec.jobs[0])) == 1):
            return ""
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        if task_type is None or task_id is None:
            raise InvalidArgumentError(
                f"cannot tell which task's address to return: the task type is {task_type!r} "
                f"and the task index {task_id!r}; set {TF_CONFIG}['task'] = "
                "{'type': ..., 'index': ...} or pass task_type and task_id"
            )
        address = spec.task_address(task_type, task_id)
        return format_master_url(address, self.rpc_layer if rpc_layer is None else rpc_layer)
