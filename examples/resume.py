"""``make demo``, second stage: training killed midway resumes from its checkpoint, and every
record is trained on exactly once.

A small PyTorch model trains on batches from the data service (DYNAMIC sharding) read through
``convoy.torch.IterableDataset`` by a ``StatefulDataLoader`` with two loader workers. A
``cv.train.Checkpoint`` saves the model, the optimizer and the loader (each loader worker's
position in the job) every few steps. The training process kills itself (SIGKILL) at a fixed
point, a few steps after its first checkpoint; run again, it restores the checkpoint and trains
on the rest. The demo then checks the records trained on: those before the checkpoint and those
after the restart are every record, each once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

NUM_RECORDS = 2_000
BATCH_SIZE = 25
CHECKPOINT_EVERY = 20  # steps
KILL_AT_STEP = 27  # the first run kills itself here: after checkpoint 1, before checkpoint 2


def pipeline(target: str) -> Any:
    """Records (id, 8 features, label) made and batched on the data service."""
    import numpy as np

    import convoy as cv

    def record(i: np.int64) -> tuple[np.int64, np.ndarray, np.float32]:
        features = np.sin(np.arange(8, dtype=np.float32) * (float(i) + 1.0))
        return i, features, np.float32(features[:4].sum() > 0)

    return (cv.data.Dataset.range(NUM_RECORDS).shuffle(500, seed=7).map(record)
            .batch(BATCH_SIZE)
            .apply(cv.data.service.distribute("distributed_epoch", target)))


def train(target: str, work: Path) -> None:
    """One run of the training script: resume if a checkpoint is there; log each step's ids."""
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader  # type: ignore[import-untyped]

    import convoy as cv

    # torchdata's StatefulDataLoader calls a torch function that torch has deprecated: noise
    warnings.filterwarnings("ignore", "'set_vital' is deprecated", UserWarning)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = StatefulDataLoader(cv.torch.IterableDataset(pipeline(target)), batch_size=None,
                                num_workers=2)
    checkpoint = cv.train.Checkpoint(model=model, optimizer=optimizer, loader=loader)
    manager = cv.train.CheckpointManager(checkpoint, work / "checkpoints", max_to_keep=2)
    restored = manager.restore_or_initialize()
    first_run = restored is None
    with open(work / "steps.jsonl", "a") as log:
        log.write(json.dumps({"restored": restored}) + "\n")
        for step, (ids, features, labels) in enumerate(loader, 1):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(features).squeeze(1), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            log.write(json.dumps({"ids": ids.tolist(), "loss": round(loss.item(), 4)}) + "\n")
            if step % CHECKPOINT_EVERY == 0:
                log.write(json.dumps({"checkpoint": manager.save()}) + "\n")
            log.flush()
            if first_run and step == KILL_AT_STEP:
                print(f"  step {step}: killed (SIGKILL), {step - CHECKPOINT_EVERY} steps after "
                      f"checkpoint 1", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        log.write(json.dumps({"done": True}) + "\n")


def check(work: Path) -> bool:
    """Whether the records trained on before the restored checkpoint and after the restart
    are every record, each once; prints what happened."""
    records = [json.loads(line) for line in (work / "steps.jsonl").read_text().splitlines()]
    restart = max(i for i, r in enumerate(records) if "restored" in r)
    saved = records[restart]["restored"]
    mark = next(i for i, r in enumerate(records) if r.get("checkpoint") == saved)
    before = [n for r in records[:mark] for n in r.get("ids", ())]
    lost_steps = [r for r in records[mark:restart] if "ids" in r]
    after = [n for r in records[restart:] for n in r.get("ids", ())]
    seen = sorted(before + after)
    exactly_once = seen == list(range(NUM_RECORDS))
    print(f"  run 1 trained {len(before)} records up to checkpoint 1, then {len(lost_steps)} "
          f"more steps that the kill lost")
    print(f"  run 2 restored {Path(saved).name} and trained {len(after)} records")
    print(f"  every record seen exactly once: {exactly_once} "
          f"({len(seen)} records, {len(set(seen))} distinct, of {NUM_RECORDS})")
    return exactly_once


def run(command: list[str]) -> int:
    """Run one training process in a session of its own; returns its exit code. Its loader
    workers go with it: killed, it leaves them behind (PyTorch's workers of a killed parent
    can hang at exit, flushing their queue), so the session is ended after it."""
    process = subprocess.Popen(command, start_new_session=True)
    try:
        return process.wait(timeout=120)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # nothing left of it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", nargs=2, metavar=("TARGET", "WORK_DIR"),
                        help=argparse.SUPPRESS)  # one run of the training script
    args = parser.parse_args()
    # gRPC logs a line when a killed run's connections go away: the demo expects the kill
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if args.train:
        train(args.train[0], Path(args.train[1]))
        return 0
    try:
        import torchdata.stateful_dataloader  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        print("resume demo skipped: torchdata is not installed (pip install torchdata)")
        return 0
    from convoy.testing import InProcessCluster

    print("Training killed midway resumes from its checkpoint (data service, 2 loader workers)")
    started = time.monotonic()
    with InProcessCluster(num_workers=2) as cluster, tempfile.TemporaryDirectory() as work:
        command = [sys.executable, __file__, "--train", cluster.target, work]
        killed = run(command)
        print(f"  run 1 ended by signal {-killed} (SIGKILL is {int(signal.SIGKILL)})")
        if run(command) != 0:
            raise SystemExit("run 2 failed")
        ok = check(Path(work))
    print(f"  ({time.monotonic() - started:.1f} s)")
    return 0 if ok and killed == -signal.SIGKILL else 1


if __name__ == "__main__":
    sys.exit(main())
