"""What ``convoy status`` shows: a data service dispatcher's workers, datasets, jobs and
iterations, or a training cluster's tasks, as plain data (for ``--json``) or a table.

Both read through read-only RPCs, authenticated like every other call: the dispatcher's
``GetStatus`` and each training task's ``Status``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convoy import errors
from convoy._transport import rpc as _rpc
from convoy._transport.security import Security

__all__ = ["dispatcher_status", "render_cluster", "render_dispatcher", "training_status"]


def dispatcher_status(address: str, security: Security | None = None,
                      timeout_s: float = 10.0) -> dict[str, Any]:
    """The status of the dispatcher at ``address`` (``HOST:PORT`` or ``grpc://HOST:PORT``):
    ``workers`` (``address``, ``last_heartbeat_s``, ``tasks``, ``buffered_elements``,
    ``buffered_bytes``), ``datasets``, ``jobs`` (``name``, ``policy``, ``iterations``,
    ``optimal_workers``...) and ``optimal_workers``, the workers all jobs need (None while
    unknown), with ``consumer_wait_fraction``, the largest share of time a consumer waited."""
    from convoy.data.service import service_pb2 as pb
    from convoy.data.service._common.wire import DISPATCHER, DISPATCHER_METHODS

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


def training_status(cluster: Mapping[str, Any], security: Security | None = None,
                    timeout_s: float = 10.0) -> dict[str, Any]:
    """The status of each ps and worker of ``cluster`` (a cluster spec): a ps's variables and
    their bytes, a worker's functions running; a task that does not answer has an ``error``."""
    from convoy.distribute._wire import PS_SERVICE, STATUS, WORKER_SERVICE, decode_one, encode
    from convoy.distribute.cluster import ClusterSpec

    spec = ClusterSpec(cluster)
    tasks = []
    for job, service in (("ps", PS_SERVICE), ("worker", WORKER_SERVICE)):
        for index in spec.task_indices(job) if job in spec.jobs else ():
            address = spec.task_address(job, index)
            client = _rpc.Client(address, service, [STATUS], security)
            try:
                tasks.append(decode_one(client.call("Status", encode(None), timeout=timeout_s)))
            except errors.ConvoyError as error:
                tasks.append({"job": job, "index": index, "address": address,
                              "error": f"{type(error).__name__}: {error}"})
            finally:
                client.close()
    return {"tasks": tasks}


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


# ----- tables -------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [headers, *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _ids(ids: list[int], most: int = 4) -> str:
    shown = ",".join(map(str, ids[:most]))
    return shown + (f",+{len(ids) - most}" if len(ids) > most else "") if ids else "-"


def render_dispatcher(status: Mapping[str, Any]) -> str:
    """``status`` (of :func:`dispatcher_status`) as tables for a terminal."""
    lines = [f"dispatcher {status['dispatcher']} (up {status['uptime_s']:.0f} s): "
             f"{len(status['workers'])} workers, {len(status['datasets'])} datasets, "
             f"{len(status['jobs'])} jobs; workers needed: "
             f"{status.get('optimal_workers') or 'unknown'}", ""]
    lines += _table(["WORKER", "LAST HEARTBEAT", "TASKS", "BUFFERED", "BUFFERED BYTES"],
                    [[w["address"], f"{w['last_heartbeat_s']:.1f} s ago", _ids(w["tasks"]),
                      w["buffered_elements"], _bytes(w["buffered_bytes"])]
                     for w in status["workers"]])
    lines.append("")
    lines += _table(["DATASET", "CARDINALITY", "SPLIT UNITS", "COMPRESSION"],
                    [[d["dataset_id"], d["cardinality"], d["num_split_units"],
                      d["compression"] or "-"] for d in status["datasets"]])
    lines.append("")
    rows = []
    for job in status["jobs"]:
        name = job["name"] or f"(anonymous {job['job_id']})"
        for it in job["iterations"] or [None]:
            rows.append([name, job["policy"], job["dataset_id"]] + (
                ["-"] * 6 if it is None else [
                    f"{it['iteration_id']} (rep {it['repetition']})", it["consumers"],
                    _ids(it["tasks"]), f"{it['splits_acknowledged']}/{it['splits_handed_out']}",
                    "-" if it["elements_served"] is None else it["elements_served"],
                    "finished" if it["finished"] else "running"]))
    lines += _table(["JOB", "POLICY", "DATASET", "ITERATION", "CONSUMERS", "TASKS",
                     "SPLITS DONE/OUT", "SERVED", "STATE"], rows)
    return "\n".join(lines)


def render_cluster(status: Mapping[str, Any]) -> str:
    """``status`` (of :func:`training_status`) as tables for a terminal."""
    rows = []
    for task in status["tasks"]:
        where = f"{task['job']}:{task['index']}"
        if "error" in task:
            rows.append([where, task["address"], "DOWN", task["error"][:80]])
        elif task["job"] == "ps":
            variables = task["variables"]
            size = sum(v["bytes"] + v["slot_bytes"] for v in variables)
            rows.append([where, task["address"], "up",
                         f"{len(variables)} variables, {_bytes(size)}"])
        else:
            rows.append([where, task["address"], "up",
                         f"{task['functions_running']} functions running, "
                         f"{task['functions_done']} done"])
    lines = _table(["TASK", "ADDRESS", "STATE", "HOLDS"], rows)
    variables = [(task["address"], v) for task in status["tasks"]
                 for v in task.get("variables", ())]
    if variables:
        lines.append("")
        lines += _table(["VARIABLE", "PS", "SHAPE", "DTYPE", "BYTES", "SLOT BYTES"],
                        [[v["name"], address, "x".join(map(str, v["shape"])) or "()",
                          v["dtype"], _bytes(v["bytes"]), _bytes(v["slot_bytes"])]
                         for address, v in variables])
    return "\n".join(lines)
