"""CPU per step of ``ps_embedding``'s two steps (PyTorch's and the numpy one) in one process:
the same variables, sharded in two, in stores of this process; no transport, no threads.

What is left when spreading the step over processes is taken away: the work itself and the
library's Python around it. Usage: ``python bench/ps_step_local.py [--steps N]
[--profile torch|numpy [--sort tottime|cumtime|ncalls]]`` (``--profile``: cProfile of that
step).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workloads  # noqa: E402

import convoy as cv  # noqa: E402
from convoy.distribute.variables import ShardedVariable  # noqa: E402


class _Batches:
    """The workload's first batches, over and over."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches, self.index = batches, 0

    def __next__(self) -> Any:
        self.index += 1
        return self.batches[self.index % len(self.batches)]


def main() -> None:
    import torch

    torch.set_num_threads(1)  # as on a training worker
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--profile", choices=("torch", "numpy"), default=None)
    parser.add_argument("--sort", choices=("tottime", "cumtime", "ncalls"), default="tottime")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = rng.normal(0, 0.05, (100_000, 64)).astype(np.float32)
    table = ShardedVariable([cv.Variable(rows[:50_000].copy()),
                             cv.Variable(rows[50_000:].copy())], name="table")
    weights, bias = cv.Variable(np.zeros(64, np.float32)), cv.Variable(np.zeros((), np.float32))
    optimizer = cv.optimizers.SGD(workloads.LEARNING_RATE)
    batches = _Batches(list(workloads._embedding_dataset().take(64)))
    steps = {
        "torch": lambda: workloads._embedding_step(batches, table, weights, bias, optimizer),
        "numpy": lambda: workloads._embedding_step_tfstyle(batches, table, weights, bias),
    }
    for _ in range(2):  # interleaved: the machine's load moves both alike
        for name, step in steps.items():
            for _ in range(100):
                step()
            started = time.process_time()
            for _ in range(args.steps):
                step()
            used = (time.process_time() - started) / args.steps
            print(f"{name:6} {used * 1e6:7.0f} us of CPU per step")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.steps):
            steps[args.profile]()
        profile.disable()
        pstats.Stats(profile).sort_stats(args.sort).print_stats(30)


if __name__ == "__main__":
    main()
