"""Benchmarks: ``make bench`` runs every workload a few times and prints median throughputs.

It also writes them to ``bench/results/<date>.json`` (``--results PATH`` elsewhere): per
workload its unit, convoy's and TensorFlow's medians and ranges and their ratio, with the
machine and its load; ``make bench-plot`` (bench/plot.py) draws them.

When ``make bench-tf`` has made the TensorFlow environment (.venv-tf), TensorFlow's side of
each workload (tf_workloads.py) runs there too, in processes of its own, and the table shows
convoy/TensorFlow. Usage: ``python bench/run.py [--repeats N] [NAME ...]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
TF_PYTHON = BENCH.parent / ".venv-tf" / "bin" / "python"
sys.path.insert(0, str(BENCH))

import tf_workloads  # noqa: E402  (bench/ is not a package; imports no TensorFlow)
import workloads  # noqa: E402

# one TensorFlow run of a workload: startup, then each repeat
TF_TIMEOUT_S = 120.0
TF_TIMEOUT_PER_REPEAT_S = 120.0


#: Workloads also reported as a ratio to another convoy workload.
RELATIVE = {"ps_embedding_module": "ps_embedding", "ps_dynamic_embedding": "ps_embedding_module",
            "tfrecord_s3": "tfrecord_s3_raw"}


class Summary:
    """Median, lowest and highest of repeated throughputs."""

    def __init__(self, results: list[float]) -> None:
        self.median = statistics.median(results)
        self.low, self.high = min(results), max(results)

    def as_json(self) -> dict[str, float]:
        return {"median": self.median, "low": self.low, "high": self.high}

    def cells(self) -> str:
        spread = f"{_number(self.low)} - {_number(self.high)}"
        return f"{_number(self.median):>12}{spread:>22}"


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _convoy(run: Callable[[], float], repeats: int) -> Summary:
    return Summary([run() for _ in range(repeats)])


def _tensorflow(name: str, repeats: int) -> Summary | str:
    """TensorFlow's side of workload ``name`` in its own process, or why it did not run."""
    command = [str(TF_PYTHON), str(BENCH / "tf_workloads.py"), "--repeats", str(repeats), name]
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    try:
        # on a timeout or an interrupt, subprocess.run kills the process; its servers
        # exit once their parent is gone
        done = subprocess.run(command, capture_output=True, text=True, env=environment,
                              timeout=TF_TIMEOUT_S + TF_TIMEOUT_PER_REPEAT_S * repeats)
    except subprocess.TimeoutExpired as error:
        return f"timed out after {error.timeout:.0f} s"
    lines = done.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if lines else {}
    if done.returncode != 0 or "results" not in report:
        why = report.get("error") or "\n    ".join(done.stderr.strip().splitlines()[-6:])
        return f"failed (exit code {done.returncode}): {why}"
    return Summary(report["results"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help="workloads to run (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-tensorflow", action="store_true",
                        help="run convoy's side only, even where .venv-tf exists")
    parser.add_argument("--results", type=Path, default=None,
                        help="the results file (default: bench/results/<date>.json, "
                             "numbered on if that exists)")
    args = parser.parse_args()
    known = {w.name for w in workloads.ALL}
    unknown = [name for name in args.names if name not in known]
    if unknown:
        parser.error(f"unknown workloads {unknown}; expected some of {sorted(known)}")
    selected = [w for w in workloads.ALL if not args.names or w.name in args.names]
    with_tf = TF_PYTHON.exists() and not args.no_tensorflow
    if not TF_PYTHON.exists():
        print("TensorFlow: not installed, run make bench-tf")
    header = f"{'workload':<24}{'unit':<12}{'convoy':>12}{'range':>22}"
    if with_tf:
        header += f"{'tensorflow':>12}{'range':>22}{'ratio':>10}"
    print(header)
    print("-" * len(header))
    failures = []
    medians: dict[str, float] = {}
    rows: list[dict[str, object]] = []
    started = time.perf_counter()
    load_before = os.getloadavg()
    try:
        for workload in selected:
            ours = _convoy(workload.convoy, min(args.repeats, workload.repeats or args.repeats))
            medians[workload.name] = ours.median
            line = f"{workload.name:<24}{workload.unit:<12}{ours.cells()}"
            row: dict[str, object] = {"workload": workload.name, "unit": workload.unit,
                                      "convoy": ours.as_json(), "tensorflow": None,
                                      "ratio": None}
            rows.append(row)
            if with_tf and workload.name in tf_workloads.WORKLOADS:
                theirs = _tensorflow(workload.name, args.repeats)
                if isinstance(theirs, Summary):
                    line += f"{theirs.cells()}{ours.median / theirs.median:>9.2f}x"
                    row["tensorflow"] = theirs.as_json()
                    row["ratio"] = ours.median / theirs.median
                else:
                    line += f"{'(failed)':>12}"
                    failures.append(f"TensorFlow {workload.name}: {theirs}")
            print(line, flush=True)
    finally:
        workloads.stop_clusters()
    for name, baseline in RELATIVE.items():
        if name in medians and baseline in medians:
            print(f"{name} / {baseline}: {medians[name] / medians[baseline]:.2f}x (medians)")
    for note in workloads.NOTES:
        print(note)
    for failure in failures:
        print(failure)
    _save(args.results, rows, args.repeats, time.perf_counter() - started, load_before,
          failures)
    return 1 if failures else 0


def _save(path: Path | None, rows: list[dict[str, object]], repeats: int, seconds: float,
          load_before: tuple[float, float, float], failures: list[str]) -> None:
    """Write the run's results as JSON for bench/plot.py."""
    today = datetime.date.today().isoformat()
    if path is None:
        path = BENCH / "results" / f"{today}.json"
        number = 2
        while path.exists():
            path = BENCH / "results" / f"{today}-{number}.json"
            number += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory = None
    report = {
        "source": "bench/run.py " + " ".join(sys.argv[1:]),
        "date": today,
        "machine": {"cpus": _cpus(), "memory": f"{memory:.0f} GiB" if memory else None,
                    "platform": platform.platform(), "python": platform.python_version()},
        "load": {"before": list(load_before), "after": list(os.getloadavg())},
        "seconds": round(seconds, 1),
        "repeats": repeats,
        "tensorflow": "tensorflow-cpu" if TF_PYTHON.exists() else None,
        "results": rows,
        "notes": list(workloads.NOTES),  # figures a workload prints beside its result
        "failures": failures,
    }
    path.write_text(json.dumps(report, indent=1) + "\n")
    shown = path.relative_to(BENCH.parent) if path.is_relative_to(BENCH.parent) else path
    print(f"results written to {shown}")


def _cpus() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    if usable is None or usable == os.cpu_count():
        return f"{os.cpu_count()} CPUs"
    return f"{usable} of {os.cpu_count()} CPUs usable"


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"(medians of repeated runs, ranges lowest - highest; ratio of the medians; "
          f"{time.perf_counter() - started:.0f} s in all; {_cpus()}; load average {load})")
    sys.exit(code)
