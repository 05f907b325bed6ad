"""DDP as a user runs it: two spawned ranks (gloo), the default equal shares of a distributed
epoch, every step an all-reduce, for each loader setting; some runs are killed mid-epoch
(every rank, SIGKILL) and resumed from each rank's StatefulDataLoader state. Every rank
takes as many steps, each element is trained once per epoch, and nothing hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from convoy.testing import InProcessCluster, free_port

RANK = """
import datetime, json, os, pickle, signal, sys
import torch, torch.distributed as dist
import convoy as cv
from torchdata.stateful_dataloader import StatefulDataLoader

rank, target, port, out, workers, persistent, kill_at = sys.argv[1:8]
workers, persistent, kill_at = int(workers), persistent == "1", int(kill_at)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank),
                        world_size=2, timeout=datetime.timedelta(seconds=30))
ds = (cv.data.Dataset.range(2_005).batch(5)
        .apply(cv.data.service.distribute("distributed_epoch", target)))
train = cv.torch.IterableDataset(ds)                   # equal shares ("pad") by default
loader = StatefulDataLoader(train, batch_size=None, num_workers=workers,
                            persistent_workers=persistent)
saved = out + ".state"
start = 0
if os.path.exists(saved):                              # killed: resume
    with open(saved, "rb") as f:
        start, state = pickle.load(f)
    loader.load_state_dict(state)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
seen = {}
for epoch in range(start, 2):
    train.set_epoch(epoch)
    seen[epoch] = []
    for step, batch in enumerate(loader):
        model(batch.float().unsqueeze(1)).mean().backward()   # all-reduced: every rank steps
        seen[epoch] += batch.tolist()
        if kill_at and epoch == 0 and step + 1 == kill_at and start == 0:
            with open(saved, "wb") as f:
                pickle.dump((0, loader.state_dict()), f)
            with open(out + ".before", "w") as f:
                json.dump(seen, f)
            dist.barrier()                             # both ranks saved, then both die
            os.kill(os.getpid(), signal.SIGKILL)
dist.barrier()
dist.destroy_process_group()
with open(out, "w") as f:
    json.dump(seen, f)
"""


@pytest.fixture(scope="module")
def cluster():
    with InProcessCluster(num_workers=2) as cluster:
        yield cluster


def _run(script: Path, cluster: InProcessCluster, tmp_path: Path, args: list[str]) -> list[int]:
    port = str(free_port())
    ranks = [subprocess.Popen([sys.executable, str(script), str(rank), cluster.target, port,
                               str(tmp_path / f"rank{rank}.json"), *args],
                              env=os.environ.copy(), stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    codes = []
    for process in ranks:
        try:
            codes.append(process.wait(timeout=100))
        finally:
            process.kill()
    return codes


@pytest.mark.skip(reason="known bug (issue 29): in spawned gloo ranks one epoch in two ends "
                  "a batch short on one rank (the dispatcher counted 402 elements taken of 401)")
@pytest.mark.timeout(240)
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("kill", [False, True])
@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_ddp_ranks_step_alike_and_resume(cluster, tmp_path, workers, persistent, kill):
    pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK))
    args = [str(workers), str(int(persistent)), "7" if kill else "0"]
    if kill:
        assert _run(script, cluster, tmp_path, args) == [-9, -9]
    assert _run(script, cluster, tmp_path, args) == [0, 0]
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    before = [json.loads((tmp_path / f"rank{rank}.json.before").read_text()) if kill else {}
              for rank in range(2)]
    for epoch in ("0", "1"):
        mine = [before[rank].get(epoch, []) + seen[rank][epoch] for rank in range(2)]
        assert len(mine[0]) == len(mine[1]), epoch  # as many batches (of 5) on each rank
        together = mine[0] + mine[1]  # "pad": 401 batches, one of them twice
        assert set(together) == set(range(2_005)) and len(together) == 2_010, epoch
