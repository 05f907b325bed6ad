"""Where a ``ps_embedding`` step's CPU goes, per process: CPU (user, system), context switches
and messages per step, for the chief (this process), each worker and each ps.

Usage: ``python bench/ps_profile.py [--steps N] [--tfstyle | --module] [--py-spy DIR]
[--perf FILE]`` (``--module``: the step on a placed ``nn.Module``, ``ps_embedding_module``'s;
``--dynamic``: that step on ``ps_dynamic_embedding``'s model, warmed up, and Zipf ids).
CPU and context switches come from ``/proc`` (every thread of each process), messages from
each server's ``rpc_duration_seconds_count``. With ``--py-spy``, ``py-spy record`` samples
every process during the measured steps and writes its raw stacks per process into DIR
(py-spy samples waiting threads too: leave out the waits when adding them up). With
``--perf``, ``perf record`` samples the CPU of every process (native code and the kernel)
into FILE: ``perf report -i FILE --sort pid,dso`` splits it by process and library.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import workloads  # noqa: E402

import convoy as cv  # noqa: E402
from convoy.testing import TrainingCluster, free_port  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


class _MeteredCluster(TrainingCluster):
    """A TrainingCluster whose tasks each serve their metrics on a port of their own."""

    def _task(self, job: str, index: int):  # type: ignore[no-untyped-def]
        task = super()._task(job, index)
        task.args += ["--metrics-port", str(free_port())]
        return task


def _counters(pid: int) -> dict[str, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    counts = {"user_s": int(fields[11]) / TICK, "system_s": int(fields[12]) / TICK,
              "voluntary": 0.0, "involuntary": 0.0, "faults": float(fields[7])}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue
        counts["voluntary"] += int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", status)[1])
        counts["involuntary"] += int(re.search(r"nonvoluntary_ctxt_switches:\s+(\d+)",
                                               status)[1])
    return counts


def _messages(port: int) -> dict[str, float]:
    """Each method's calls served so far, and (as ``"<method> s"``) the seconds spent."""
    text = urllib.request.urlopen(f"http://localhost:{port}/metrics", timeout=5).read().decode()
    found: dict[str, float] = {}
    for part, labels, value in re.findall(
            r"rpc_duration_seconds_(count|sum)\{([^}]*)\} ([\d.e+-]+)", text):
        method = re.search(r'method="(\w+)"', labels)
        if method:  # every status code's calls together
            key = method[1] if part == "count" else f"{method[1]} s"
            found[key] = found.get(key, 0.0) + float(value)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    face = parser.add_mutually_exclusive_group()
    face.add_argument("--tfstyle", action="store_true")
    face.add_argument("--module", action="store_true")
    face.add_argument("--dynamic", action="store_true")
    parser.add_argument("--py-spy", default=None, metavar="DIR")
    parser.add_argument("--perf", default=None, metavar="FILE")
    parser.add_argument("--perf-only", default=None, metavar="PROCESS",
                        help="perf samples this process alone (chief, ps0, worker1, ...)")
    parser.add_argument("--rate", type=int, default=100, help="py-spy's samples per second")
    parser.add_argument("--all-threads", action="store_true",
                        help="py-spy samples threads that run without the GIL too")
    args = parser.parse_args()
    step = workloads._embedding_step_tfstyle if args.tfstyle else \
        workloads._module_step if args.module or args.dynamic else workloads._embedding_step
    with _MeteredCluster(num_workers=2, num_ps=2) as cluster:
        strategy = cv.distribute.ParameterServerStrategy(
            cluster.resolver(),
            variable_partitioner=cv.distribute.partitioners.FixedShardsPartitioner(2))
        with strategy.scope():
            made = workloads._embedding_module() if args.module else \
                (cv.torch.place(workloads.DynamicEmbeddingModel()),
                 cv.optimizers.SGD(workloads.LEARNING_RATE)) if args.dynamic else \
                workloads._embedding_variables(not args.tfstyle)
        if args.dynamic:  # the bench's warm-up: a million rows made
            for first in range(0, workloads.WARM_ROWS, 50_000):
                made[0].bag.table.lookup(np.arange(first, first + 50_000))
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        dataset_fn = workloads._zipf_dataset if args.dynamic else workloads._embedding_dataset
        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        step_args = (iterator, *made)
        for _ in range(50):
            coordinator.schedule(step, step_args)
        coordinator.join()
        processes = {"chief": os.getpid()}
        ports = {}
        for (job, index), server in sorted(cluster.servers.items()):
            processes[f"{job}{index}"] = server.process.pid
            ports[f"{job}{index}"] = int(server.args[server.args.index("--metrics-port") + 1])
        before = {name: _counters(pid) for name, pid in processes.items()}
        sent = {name: _messages(port) for name, port in ports.items()}
        spies = []
        if args.py_spy:
            Path(args.py_spy).mkdir(parents=True, exist_ok=True)
            for name, pid in processes.items():
                spies.append(subprocess.Popen(
                    [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
                     "--rate", str(args.rate), "--nonblocking", "--threads",
                     *(() if args.all_threads else ("--gil",)), "--format", "raw",
                     "--output", f"{args.py_spy}/{name}.txt"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
            before = {name: _counters(pid) for name, pid in processes.items()}
            sent = {name: _messages(port) for name, port in ports.items()}
        if args.perf:
            spies.append(subprocess.Popen(
                ["perf", "record", "-g", "-F", "499", "-o", args.perf,
                 "-p", ",".join(str(pid) for name, pid in processes.items()
                                if args.perf_only in (None, name))],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
            before = {name: _counters(pid) for name, pid in processes.items()}
            sent = {name: _messages(port) for name, port in ports.items()}
        started = time.perf_counter()
        for _ in range(args.steps):
            coordinator.schedule(step, step_args)
        coordinator.join()
        seconds = time.perf_counter() - started
        after = {name: _counters(pid) for name, pid in processes.items()}
        received = {name: _messages(port) for name, port in ports.items()}
        for spy in spies:
            spy.send_signal(2)
        for spy in spies:
            spy.wait(30)
        coordinator.shutdown()
    per_step = {name: {key: (after[name][key] - before[name][key]) / args.steps
                       for key in before[name]} for name in processes}
    face = "tfstyle" if args.tfstyle else "module" if args.module else \
        "dynamic" if args.dynamic else "torch"
    print(f"{args.steps / seconds:.0f} steps/s, {face}")
    print(f"{'process':<8}{'user ms':>9}{'sys ms':>9}{'vol cs':>8}{'invol cs':>9}{'faults':>8}"
          "  messages")
    total = {key: 0.0 for key in ("user_s", "system_s", "voluntary", "involuntary", "faults")}
    for name, counts in per_step.items():
        messages = {m: (received[name].get(m, 0) - sent[name].get(m, 0)) / args.steps
                    for m in received.get(name, {})}
        shown = ", ".join(
            f"{m} {n:.2f} ({messages.get(f'{m} s', 0) / n * 1e3:.2f} ms each)"
            for m, n in messages.items() if n and not m.endswith(" s"))
        print(f"{name:<8}{counts['user_s'] * 1e3:>9.2f}{counts['system_s'] * 1e3:>9.2f}"
              f"{counts['voluntary']:>8.1f}{counts['involuntary']:>9.1f}{counts['faults']:>8.1f}"
              f"  {shown}")
        for key in total:
            total[key] += counts[key]
    print(f"{'all':<8}{total['user_s'] * 1e3:>9.2f}{total['system_s'] * 1e3:>9.2f}"
          f"{total['voluntary']:>8.1f}{total['involuntary']:>9.1f}{total['faults']:>8.1f}")
    print(json.dumps({"steps_per_s": args.steps / seconds, "per_step": per_step}))


if __name__ == "__main__":
    main()
