"""Train a small recommendation model on parameter servers, fed by the data service.

The cluster is real processes: a data-service dispatcher and two data workers, two
parameter servers and two training workers; this process is the chief (the coordinator).
The model is a PyTorch module, an embedding table (users and items hashed into one table)
plus a small MLP, placed on the parameter servers with ``cv.torch.place`` (the table sharded
over both); the data is generated with a known signal (each id has a hidden preference, and a
click is more likely when user and item preferences agree). The chief registers the dataset
once; each training worker reads it with ``from_dataset_id`` on a shared job. The training
step is ordinary PyTorch; Adam with sparse row updates runs on the parameter servers, and so
does the AUC (``cv.metrics.AUC``), updated by the workers. At the end it reports the AUC on
held-out data, saves a checkpoint and restores it into a model with a different number of
shards.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import convoy as cv
from convoy.testing import ProcessCluster, TrainingCluster

try:
    from tqdm import tqdm
except ImportError:  # progress bars are optional
    tqdm = None

NUM_IDS = 2_000
DIM = 16
HIDDEN = 16
BATCH = 256


class Recommender(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(NUM_IDS, DIM)
        self.hidden = nn.Linear(3 * DIM, HIDDEN, bias=False)
        self.output = nn.Linear(HIDDEN, 1, bias=False)
        nn.init.normal_(self.embedding.weight, 0, 0.1)
        nn.init.normal_(self.hidden.weight, 0, 0.3)
        nn.init.normal_(self.output.weight, 0, 0.3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.embedding(ids)
        users, items = rows[:, 0], rows[:, 1]
        features = torch.cat([users, items, users * items], dim=1)
        return self.output(torch.relu(self.hidden(features))).squeeze(-1)


def make_records(num: int, seed: int) -> dict[str, np.ndarray]:
    """Users, items and clicks with a known signal: each id has a hidden popularity and a
    hidden taste; clicks are likelier for popular ids and for agreeing tastes."""
    hidden = np.random.default_rng(1234).standard_normal((2, NUM_IDS))
    popularity, taste = hidden
    rng = np.random.default_rng(seed)
    users = rng.integers(0, NUM_IDS // 2, num)
    items = rng.integers(NUM_IDS // 2, NUM_IDS, num)
    affinity = popularity[users] + popularity[items] + 2.0 * taste[users] * taste[items]
    clicks = (rng.random(num) < 1 / (1 + np.exp(-affinity))).astype(np.float32)
    return {"ids": np.stack([users, items], axis=1), "label": clicks}


def build(strategy: cv.distribute.ParameterServerStrategy) -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    with strategy.scope():
        model = cv.torch.place(Recommender())
        optimizer = cv.optimizers.Adam(learning_rate=0.01)  # its step counter lives on a ps
    return model, optimizer


def mean_loss(finished: list) -> float:
    """The mean loss of the last 50 finished steps (0 before the first)."""
    recent = [r.fetch() for r in finished[-50:]]
    return float(np.mean(recent)) if recent else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    print("starting a data service (dispatcher + 2 workers) and a training cluster "
          "(2 ps + 2 workers) as processes ...")
    with ProcessCluster(2) as data_service, TrainingCluster(num_workers=2, num_ps=2) as cluster:
        strategy = cv.distribute.ParameterServerStrategy(
            cluster.resolver(),
            variable_partitioner=cv.distribute.partitioners.MinSizePartitioner(
                min_shard_bytes=64 << 10, max_shards=2))
        model, optimizer = build(strategy)
        with strategy.scope():
            held_out_auc = cv.metrics.AUC(name="held_out_auc")
        print("embedding:", model.variables[0])
        coordinator = cv.distribute.ClusterCoordinator(strategy)

        train = make_records(args.steps * BATCH, seed=1)
        dataset_id = cv.data.service.register_dataset(
            data_service.target,
            cv.data.Dataset.from_tensor_slices(train).batch(BATCH, drop_remainder=True))
        service = data_service.target

        def dataset_fn():
            return cv.data.service.from_dataset_id(
                processing_mode="distributed_epoch", service=service, dataset_id=dataset_id,
                job_name="train").repeat()

        def train_step(iterator):  # runs on a training worker
            batch = next(iterator)
            logits = model(torch.tensor(batch["ids"]))
            loss = F.binary_cross_entropy_with_logits(logits, torch.tensor(batch["label"]))
            loss.backward()
            optimizer.apply_gradients(model.gradients())
            return loss.item()

        def evaluate(ids, labels):  # runs on a training worker
            with torch.no_grad():
                held_out_auc.update_state(labels, torch.sigmoid(model(torch.from_numpy(ids))))

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        losses = [coordinator.schedule(train_step, args=(iterator,))
                  for _ in range(args.steps)]
        bar = tqdm(total=args.steps, unit="step", desc="training") if tqdm else None
        started = time.perf_counter()
        while not coordinator.done():
            finished = [r for r in losses if r.done()]
            if bar:
                bar.update(len(finished) - bar.n)
                rate = len(finished) / max(time.perf_counter() - started, 1e-9)
                bar.set_postfix(loss=f"{mean_loss(finished):.3f}", steps_s=f"{rate:.0f}")
            time.sleep(0.2)
        coordinator.join()
        rate = args.steps / max(time.perf_counter() - started, 1e-9)
        if bar:
            bar.update(args.steps - bar.n)
            bar.set_postfix(loss=f"{mean_loss(losses):.3f}", steps_s=f"{rate:.0f}")
            bar.close()
        else:
            print(f"training: {args.steps} steps, loss {mean_loss(losses):.3f} "
                  f"({rate:.0f} steps/s)")

        held_out = make_records(20_000, seed=2)
        for start in range(0, 20_000, 2_000):
            coordinator.schedule(evaluate, args=(held_out["ids"][start:start + 2_000],
                                                 held_out["label"][start:start + 2_000]))
        coordinator.join()
        score = float(held_out_auc.result())
        print(f"held-out AUC: {score:.3f} (0.5 is chance)")

        ids = torch.from_numpy(held_out["ids"])
        with tempfile.TemporaryDirectory(prefix="convoy-ckpt-") as directory:
            manager = cv.train.CheckpointManager(
                cv.train.Checkpoint(model=model, optimizer=optimizer), directory, max_to_keep=2)
            path = manager.save()
            resharded = cv.distribute.ParameterServerStrategy(
                cluster.resolver(),
                variable_partitioner=cv.distribute.partitioners.FixedShardsPartitioner(3))
            restored, restored_optimizer = build(resharded)
            cv.train.Checkpoint(model=restored, optimizer=restored_optimizer).read(
                path).assert_consumed()
            with torch.no_grad():  # on the chief, the modules read the parameter servers
                same = torch.allclose(restored(ids), model(ids))
            print(f"checkpoint {path.rsplit('/', 1)[-1]} restored into "
                  f"{len(restored.variables[0].variables)} shards: "
                  f"{'same predictions' if same else 'MISMATCH'}")
        coordinator.shutdown()
    return 0 if score > 0.6 and same else 1


if __name__ == "__main__":
    raise SystemExit(main())
