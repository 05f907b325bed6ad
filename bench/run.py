"""Benchmarks: ``make bench`` runs every workload a few times and prints median throughputs.

Where TensorFlow is importable, the same workload also runs on TensorFlow in the same run and
the table shows convoy/TensorFlow. Usage: ``python bench/run.py [--repeats N] [NAME ...]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import workloads  # noqa: E402  (bench/ is not a package)


def _median(run: Callable[[], float], repeats: int) -> tuple[float, float, float]:
    """Median, lowest and highest of ``repeats`` runs."""
    results = [run() for _ in range(repeats)]
    return statistics.median(results), min(results), max(results)


def _tensorflow_available() -> bool:
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help="workloads to run (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    selected = [w for w in workloads.ALL if not args.names or w.name in args.names]
    with_tf = _tensorflow_available()
    header = f"{'workload':<22}{'convoy':>14}  {'unit':<12}{'range':>22}"
    if with_tf:
        header += f"{'tensorflow':>14}{'ratio':>9}"
    print(header)
    print("-" * len(header))
    try:
        for workload in selected:
            ours, low, high = _median(workload.convoy, args.repeats)
            spread = f"{low:,.0f} - {high:,.0f}"
            line = f"{workload.name:<22}{ours:>14,.0f}  {workload.unit:<12}{spread:>22}"
            if with_tf and workload.tensorflow is not None:
                theirs = _median(workload.tensorflow, args.repeats)[0]
                line += f"{theirs:>14,.0f}{ours / theirs:>8.1f}x"
            print(line, flush=True)
    finally:
        workloads.stop_clusters()
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"(medians of repeated runs; {time.perf_counter() - started:.0f} s in all)")
    sys.exit(code)
