"""A training process killed mid-epoch (SIGKILL) and restarted from its last checkpoint trains
on exactly the rest of the epoch: the elements it trained on after the restart, with those
before the checkpoint, are the epoch, each once. Locally, under OFF (one worker) and DYNAMIC."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from convoy.testing import InProcessCluster

SRC = Path(__file__).resolve().parents[2] / "src"

TRAIN = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import convoy as cv

    mode, target, work = sys.argv[1], sys.argv[2], sys.argv[3]
    ds = cv.data.Dataset.range(400).shuffle(64, seed=7)
    if mode != "local":
        ds = ds.apply(cv.data.service.distribute(mode, target))
    ds = ds.batch(8)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(ds)
    checkpoint = cv.train.Checkpoint(model=model, optimizer=optimizer, iterator=it)
    manager = cv.train.CheckpointManager(checkpoint, os.path.join(work, "ckpt"), max_to_keep=2)
    restored = manager.restore_or_initialize()
    with open(os.path.join(work, "log"), "a") as log:
        log.write(json.dumps({"restored": restored}) + "\\n")
        for step, batch in enumerate(it, 1):
            x = torch.as_tensor(batch, dtype=torch.float32).reshape(-1, 1)
            loss = ((model(x) - x) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            log.write(json.dumps({"ids": [int(v) for v in batch]}) + "\\n")
            if step % 10 == 0:
                log.write(json.dumps({"checkpoint": manager.save()}) + "\\n")
            log.flush()
            time.sleep(0.03)  # slow enough to be killed mid-epoch
        log.write(json.dumps({"done": True}) + "\\n")
""")


def _records(log: Path) -> list[dict]:
    if not log.exists():
        return []
    lines = log.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def _run(mode: str, target: str, work: Path, kill_after_checkpoint: bool) -> None:
    script = work / "train.py"
    script.write_text(TRAIN)
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    process = subprocess.Popen([sys.executable, str(script), mode, target, str(work)], env=env)
    try:
        if not kill_after_checkpoint:
            assert process.wait(timeout=180) == 0
            return
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # killed at a fixed point: 3 steps after the
            records = _records(work / "log")  # first checkpoint
            marks = [i for i, r in enumerate(records) if "checkpoint" in r]
            if marks and len(records) - marks[0] > 3:
                break
            assert process.poll() is None, "the training ended before it was killed"
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["local", "off", "dynamic"])
def test_training_killed_mid_epoch_resumes_with_exactly_the_rest(
        mode: str, tmp_path: Path) -> None:
    with InProcessCluster(num_workers=1 if mode != "dynamic" else 2) as cluster:
        _run(mode, cluster.target, tmp_path, kill_after_checkpoint=True)
        first = _records(tmp_path / "log")
        assert not any("done" in r for r in first), "the kill came after the epoch"
        _run(mode, cluster.target, tmp_path, kill_after_checkpoint=False)
    records = _records(tmp_path / "log")
    restarts = [i for i, r in enumerate(records) if "restored" in r]
    assert len(restarts) == 2 and records[restarts[1]]["restored"] is not None
    saved = records[restarts[1]]["restored"]
    # run 1 up to the checkpoint it restarted from; run 2 whole
    (mark,) = [i for i, r in enumerate(records[:restarts[1]]) if r.get("checkpoint") == saved]
    before = [n for r in records[:mark] for n in r.get("ids", ())]
    after = [n for r in records[restarts[1]:] for n in r.get("ids", ())]
    killed = [n for r in records[mark:restarts[1]] for n in r.get("ids", ())]
    assert killed, "nothing was trained on between the checkpoint and the kill"
    assert records[-1] == {"done": True}
    assert sorted(before + after) == list(range(400))
