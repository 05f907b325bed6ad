"""Parameter-server training that survives a lost parameter server.

A placed PyTorch model trains on 2 parameter servers and 2 workers (real processes, started
here), checkpointing every few steps. Midway, ps 1 is killed (SIGKILL) and started again at its
address, as Kubernetes restarts a pod. The loop catches the error ``join`` raises, calls
``strategy.recover(manager)``, which waits for the ps, makes the variables again and restores
the latest checkpoint on every ps, and trains on with the same coordinator, model and
optimizer. The steps since that checkpoint are lost; those after it are trained again.

    python examples/ps_recover.py
"""

from __future__ import annotations

import tempfile
import threading

import numpy as np
import torch
from torch import nn

import convoy as cv
from convoy.errors import UnavailableError
from convoy.testing import TrainingCluster

STEPS, CHECKPOINT_EVERY, KILL_AT = 60, 10, 25


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """Bags of 4 ids; the label is 1 when their hidden preferences add up above 0."""
    preference = np.random.default_rng(7).standard_normal(1000)
    ids = np.random.default_rng(step).integers(0, 1000, (64, 4))
    return ids, (preference[ids].sum(1) > 0).astype(np.float32)


def main() -> None:
    with TrainingCluster(num_workers=2, num_ps=2) as cluster, \
            tempfile.TemporaryDirectory() as directory:
        strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        with strategy.scope():
            model = cv.torch.place(nn.Sequential(nn.EmbeddingBag(1000, 8), nn.Linear(8, 1)))
            optimizer = cv.optimizers.Adam(0.05)
        manager = cv.train.CheckpointManager(
            cv.train.Checkpoint(model=model, optimizer=optimizer), directory)

        def step(ids: np.ndarray, labels: np.ndarray) -> float:
            logits = model(torch.from_numpy(ids)).squeeze(-1)
            loss = nn.functional.binary_cross_entropy_with_logits(
                logits, torch.from_numpy(labels))
            loss.backward()
            optimizer.apply_gradients(model.gradients())
            return loss.item()

        done, killed = 0, False  # steps trained as of the latest checkpoint
        while done < STEPS:
            try:
                for first in range(done, STEPS, CHECKPOINT_EVERY):
                    losses = [coordinator.schedule(step, args=batch(i))
                              for i in range(first, min(first + CHECKPOINT_EVERY, STEPS))]
                    if first <= KILL_AT < first + CHECKPOINT_EVERY and not killed:
                        killed = True  # ps 1 dies now, and its pod starts again soon
                        cluster.kill_task("ps", 1)
                        threading.Timer(2.0, cluster.start_task, args=("ps", 1)).start()
                    coordinator.join()
                    done = min(first + CHECKPOINT_EVERY, STEPS)
                    manager.save()
                    print(f"step {done}: loss {np.mean(coordinator.fetch(losses)):.3f}")
            except UnavailableError as error:
                print(f"lost a parameter server: {str(error)[:100]}...")
                path = strategy.recover(manager, timeout_s=120)
                print(f"recovered from {path}; training on from step {done}")
        assert optimizer.iterations is not None  # made at once in a strategy's scope
        print(f"trained {STEPS} steps, {int(optimizer.iterations.numpy())} updates applied "
              f"(the steps lost with the ps were trained again)")
        coordinator.shutdown()


if __name__ == "__main__":
    main()
