"""A dispatcher's status as plain data: the client side of ``GetStatus`` (what ``convoy status
--dispatcher`` prints and :meth:`LocalCluster.adapt` follows)."""

from __future__ import annotations

from typing import Any

from convoy._transport import rpc as _rpc
from convoy._transport.security import Security
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.wire import DISPATCHER, DISPATCHER_METHODS


def dispatcher_status(address: str, security: Security | None = None,
                      timeout_s: float = 10.0) -> dict[str, Any]:
    """The status of the dispatcher at ``address`` (``HOST:PORT`` or ``grpc://HOST:PORT``):
    ``workers`` (``address``, ``last_heartbeat_s``, ``tasks``, ``buffered_elements``,
    ``buffered_bytes``), ``datasets``, ``jobs`` (``name``, ``policy``, ``iterations``,
    ``optimal_workers``...) and ``optimal_workers``, the workers all jobs need (None while
    unknown), with ``consumer_wait_fraction``, the largest share of time a consumer waited."""
    _, address = _rpc.parse_target(address, "dispatcher")
    client = _rpc.Client(address, DISPATCHER, DISPATCHER_METHODS, security)
    try:
        response = client.call("GetStatus", pb.GetStatusRequest(), timeout=timeout_s)
    finally:
        client.close()
    status: dict[str, Any] = {"dispatcher": address, **_plain(response)}
    status["optimal_workers"] = status["optimal_workers"] or None  # 0: not known yet
    if status["consumer_wait_fraction"] < 0:
        status["consumer_wait_fraction"] = None
    for job in status["jobs"]:
        job["optimal_workers"] = job["optimal_workers"] or None
        for iteration in job["iterations"]:
            if iteration["elements_served"] < 0:
                iteration["elements_served"] = None  # not known (not DYNAMIC)
    return status


def _plain(message: Any) -> dict[str, Any]:
    """A protobuf message as a dict of plain values (every field, defaults included)."""
    plain: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        is_message = field.message_type is not None
        if hasattr(value, "__len__") and not isinstance(value, (str, bytes)):  # repeated
            plain[field.name] = [_plain(v) for v in value] if is_message else list(value)
        else:
            plain[field.name] = _plain(value) if is_message else value
    return plain
