"""What ``convoy status`` shows: a data service dispatcher's workers, datasets, jobs and
iterations, or a training cluster's tasks, as plain data (for ``--json``) or a table.

Both read through read-only RPCs, authenticated like every other call: the dispatcher's
``GetStatus`` and each training task's ``Status``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from convoy import errors
from convoy._transport import rpc as _rpc
from convoy._transport.security import Security
from convoy.cli._commands import (
    USAGE,
    CommandError,
    _cluster,
    _RefuseSecret,
    _tf_config_cluster,
    command,
)
from convoy.data.service._client.status import dispatcher_status


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
            variables, tables = task["variables"], task.get("tables", ())
            size = sum(v["bytes"] + v["slot_bytes"] for v in variables) + \
                sum(t["bytes"] for t in tables)
            held = f"{len(variables)} variables"
            if tables:
                held += f", {len(tables)} dynamic tables"
            rows.append([where, task["address"], "up", f"{held}, {_bytes(size)}"])
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
    tables = [(task["address"], t) for task in status["tasks"] for t in task.get("tables", ())]
    if tables:
        lines.append("")
        lines += _table(["DYNAMIC TABLE", "PS", "DIM", "DTYPE", "ROWS", "EVICTIONS", "BYTES"],
                        [[t["name"], address, t["dim"], t["dtype"], t["rows"], t["evictions"],
                          _bytes(t["bytes"])] for address, t in tables])
    return "\n".join(lines)


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--dispatcher", default=None, metavar="HOST:PORT",
                        help="a data service dispatcher: its workers, datasets, jobs and "
                             "iterations")
    target.add_argument("--cluster", default=None, metavar="JSON",
                        help="a training cluster (default: TF_CONFIG's): each ps and worker, "
                             "its variables and their bytes, its functions running")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout instead of tables")
    parser.add_argument("--watch", type=float, default=None, metavar="SECONDS",
                        help="print again every SECONDS until Ctrl-C")
    parser.add_argument("--count", type=int, default=None, metavar="N",
                        help="with --watch, stop after N prints (default: until Ctrl-C)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long each call waits for its answer (default %(default)s)")
    group = parser.add_argument_group(
        "security", "The shared secret is read from --auth-token-file, else from "
        "$CONVOY_AUTH_TOKEN; TLS paths not given come from $CONVOY_TLS_*.")
    group.add_argument("--auth-token-file", default=None, metavar="PATH",
                       help="file holding the cluster's shared secret")
    group.add_argument("--auth-token", nargs="?", action=_RefuseSecret, help=argparse.SUPPRESS)
    group.add_argument("--certificate", default=None, metavar="PEM",
                       help="this client's TLS certificate (mutual TLS, with --key)")
    group.add_argument("--key", default=None, metavar="PEM", help="its TLS private key")
    group.add_argument("--ca", default=None, metavar="PEM", help="CA that signed the servers")


@command("status", "show a data service's or a training cluster's state", _status_arguments)
def _status(args: argparse.Namespace) -> int:
    if args.watch is not None and args.watch <= 0:
        raise CommandError(f"--watch must be a number of seconds > 0, got {args.watch}", USAGE)
    if args.count is not None and args.count < 1:
        raise CommandError(f"--count must be >= 1, got {args.count}", USAGE)
    security = Security.load(None, args.auth_token_file, certificate=args.certificate,
                             key=args.key, ca=args.ca)
    if args.dispatcher:
        def read() -> dict[str, Any]:
            return dispatcher_status(args.dispatcher, security, args.timeout)
        render = render_dispatcher
    else:
        cluster = _cluster(args.cluster) if args.cluster else _tf_config_cluster()

        def read() -> dict[str, Any]:
            return training_status(cluster, security, args.timeout)
        render = render_cluster
    printed = 0
    try:
        while True:
            status = read()
            if args.json:
                print(json.dumps(status), flush=True)
            else:
                if args.watch is not None and sys.stdout.isatty():
                    print("\033[2J\033[H", end="")  # clear the screen
                print(render(status), flush=True)
            printed += 1
            if args.watch is None or (args.count is not None and printed >= args.count):
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0
