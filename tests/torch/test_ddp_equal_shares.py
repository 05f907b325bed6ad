"""DDP as a user runs it: docs/pytorch.md's PyTorch example (the first one) in two spawned ranks
(gloo), the default equal shares of a distributed epoch, every step an all-reduce, for each
loader setting; some runs are stopped mid-epoch (one rank SIGKILLed, the other exiting) and
resumed from each rank's StatefulDataLoader state. Every rank takes as many steps, each
element is trained once per epoch (but the batches "pad" repeats), and nothing hangs.

Batches are counted, not elements: under DYNAMIC sharding each worker batches its own splits,
so an epoch has some short batches and its number of batches varies from run to run."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from convoy.testing import InProcessCluster, free_port

EPOCHS = 3
RANK = """
import datetime, json, os, pickle, signal, sys
import numpy as np
import torch, torch.distributed as dist
import convoy as cv
from torchdata.stateful_dataloader import StatefulDataLoader

rank, target, port, out, workers, persistent, kill_at = sys.argv[1:8]
rank, workers, persistent, kill_at = int(rank), int(workers), persistent == "1", int(kill_at)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=2, timeout=datetime.timedelta(seconds=30))
# the docs' example, with a StatefulDataLoader to resume, and the model in DDP (a rank that
# cannot go on fails within 30 s, well within the test's wait)
ds = (cv.data.Dataset.range(1_000)
        .map(lambda i: (np.full(8, i, np.float32), i % 2))
        .batch(10)
        .apply(cv.data.service.distribute("distributed_epoch", target,
                                          dispatcher_timeout_ms=30_000)))
train = cv.torch.IterableDataset(ds)                   # equal shares ("pad") by default
loader = StatefulDataLoader(train, batch_size=None, num_workers=workers,
                            persistent_workers=persistent)
saved = out + ".state"
start = 0
if os.path.exists(saved):                              # stopped: resume
    with open(saved, "rb") as f:
        start, state = pickle.load(f)
    loader.load_state_dict(state)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
seen = {}
for epoch in range(start, EPOCHS):
    train.set_epoch(epoch)
    seen[epoch] = []
    for step, (features, labels) in enumerate(loader):
        features.mul_(0.5)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(features).squeeze(1), labels.float())
        optimizer.zero_grad()
        loss.backward()                                # all-reduced: every rank steps
        optimizer.step()
        seen[epoch].append((features[:, 0] * 2).long().tolist())
        if kill_at and epoch == 1 and step + 1 == kill_at and start == 0:
            with open(saved, "wb") as f:
                pickle.dump((epoch, loader.state_dict()), f)
            with open(out + ".before", "w") as f:
                json.dump(seen, f)
            dist.barrier()                             # both ranks saved, then both stop
            if rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
dist.barrier()
dist.destroy_process_group()
with open(out, "w") as f:
    json.dump(seen, f)
""".replace("EPOCHS", str(EPOCHS))


@pytest.fixture(scope="module")
def cluster():
    with InProcessCluster(num_workers=2) as cluster:
        yield cluster


def _run(script: Path, cluster: InProcessCluster, tmp_path: Path, ranks: Any,
         args: list[str]) -> list[int]:
    """Run both ranks; their exit codes. (Their output goes to files: a killed rank's loader
    workers may outlive it a moment, holding a pipe open.)"""
    port = str(free_port())
    logs = [tmp_path / f"rank{rank}.log" for rank in range(2)]
    started = []
    for rank in range(2):
        with open(logs[rank], "a") as log:
            started.append(ranks.start(str(script), str(rank), cluster.target, port,
                                       str(tmp_path / f"rank{rank}.json"), *args,
                                       stdout=log, stderr=subprocess.STDOUT))
    codes = []
    for process, log_path in zip(started, logs):
        try:
            codes.append(process.wait(timeout=100))
        finally:
            ranks.end(process)  # with what is left of its loader workers
        if codes[-1] not in (0, -9, 3):
            sys.stderr.write(log_path.read_text()[-3000:])
    return codes


def _read(path: Path) -> dict[str, list[list[int]]]:
    return json.loads(path.read_text()) if path.exists() else {}


def _cells() -> list[Any]:
    """Loader settings x stops: one cell for each setting and each stop by default, the whole
    matrix under CONVOY_STRESS (about 8 minutes on 2 cores rather than 3)."""
    shown = {(0, False, 4), (2, False, 0), (2, True, 44)}
    return [pytest.param(workers, persistent, stop, marks=() if (
        workers, persistent, stop) in shown else pytest.mark.skipif(
            not os.environ.get("CONVOY_STRESS"),
            reason="a redundant cell of the DDP matrix: CONVOY_STRESS=1 runs it"))
        for workers, persistent in [(0, False), (2, False), (2, True)] for stop in [0, 4, 44]]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(("workers", "persistent", "stop"), _cells())
def test_ddp_ranks_step_alike_and_resume(cluster, tmp_path, ranks, workers, persistent, stop):
    """``stop``: the step of epoch 1 after which the ranks stop (0: they do not). Stopped
    near the end of the epoch (44), the loader workers' states may be some from before the
    settlement of the epoch's shares and some from after it (test_equal_shares_straddle.py
    makes sure of both)."""
    pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK))
    args = [str(workers), str(int(persistent)), str(stop)]
    if stop:
        assert _run(script, cluster, tmp_path, ranks, args) == [-9, 3]
    codes = _run(script, cluster, tmp_path, ranks, args)
    logs = "".join((tmp_path / f"rank{rank}.log").read_text() for rank in range(2))
    assert codes == [0, 0], logs[-3000:]
    for epoch in map(str, range(EPOCHS)):
        mine = [_read(tmp_path / f"rank{rank}.json.before").get(epoch, [])
                + _read(tmp_path / f"rank{rank}.json").get(epoch, []) for rank in range(2)]
        assert len(mine[0]) == len(mine[1]), epoch  # as many steps on each rank
        batches = collections.Counter(tuple(batch) for batch in mine[0] + mine[1])
        elements = [element for batch in batches for element in batch]
        assert sorted(elements) == list(range(1_000)), epoch  # each once ...
        assert sum(batches.values()) - len(batches) <= 1, epoch  # ... but a batch "pad" adds
