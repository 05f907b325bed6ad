"""Train a small recommendation model on parameter servers, fed by the data service.

The cluster is real processes: a data-service dispatcher and two data workers, two
parameter servers and two training workers; this process is the chief (the coordinator).
The model is a sharded embedding table (users and items hashed into one table) plus a small
MLP; the data is generated with a known signal (each id has a hidden preference, and a
click is more likely when user and item preferences agree). The chief registers the dataset
once; each training worker reads it with ``from_dataset_id`` on a shared job. Gradients come
from PyTorch on the workers; Adam with sparse row updates runs on the parameter servers. At
the end it reports AUC on held-out data, saves a checkpoint and restores it into a model with
a different number of shards.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

import convoy as cv
from convoy.testing import ProcessCluster, TrainingCluster

NUM_IDS = 2_000
DIM = 16
HIDDEN = 16
BATCH = 256


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


def build_model(strategy: cv.distribute.ParameterServerStrategy) -> dict[str, object]:
    rng = np.random.default_rng(0)
    with strategy.scope():
        return {
            "embedding": cv.Variable(rng.normal(0, 0.1, (NUM_IDS, DIM)).astype(np.float32),
                                     name="embedding"),
            "hidden": cv.Variable(rng.normal(0, 0.3, (3 * DIM, HIDDEN)).astype(np.float32),
                                  name="hidden"),
            "output": cv.Variable(rng.normal(0, 0.3, (HIDDEN,)).astype(np.float32),
                                  name="output"),
        }


def train_step(iterator, model, optimizer):  # runs on a training worker
    import torch

    batch = next(iterator)
    ids, labels = batch["ids"], torch.from_numpy(np.array(batch["label"]))
    embedding, hidden, output = model["embedding"], model["hidden"], model["output"]
    with cv.torch.pull(dense=[hidden, output], rows={embedding: ids}) as pulled:
        users, items = pulled[embedding][:, 0], pulled[embedding][:, 1]
        features = torch.cat([users, items, users * items], dim=1)
        logits = torch.relu(features @ pulled[0]) @ pulled[1]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
    optimizer.apply_gradients(pulled.gradients())
    return loss.item()


def predict(model: dict[str, object], ids: np.ndarray) -> np.ndarray:
    rows = cv.nn.embedding_lookup(model["embedding"], ids)
    users, items = rows[:, 0], rows[:, 1]
    features = np.concatenate([users, items, users * items], axis=1)
    hidden = np.maximum(features @ np.asarray(model["hidden"]), 0)
    return hidden @ np.asarray(model["output"])


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (rank statistic)."""
    order = np.argsort(scores)
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    positives = labels > 0.5
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def progress(done: int, total: int, loss: float, started: float) -> None:
    width = 30
    filled = width * done // total
    rate = done / max(time.perf_counter() - started, 1e-9)
    print(f"\rtraining [{'#' * filled}{'.' * (width - filled)}] {done}/{total} steps "
          f"loss {loss:.3f} ({rate:.0f} steps/s)", end="", flush=True)


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
        model = build_model(strategy)
        print("embedding:", model["embedding"])
        with strategy.scope():  # its step counter lives on a ps, as in TensorFlow
            optimizer = cv.optimizers.Adam(learning_rate=0.01)
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

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        started = time.perf_counter()
        losses = [coordinator.schedule(train_step, args=(iterator, model, optimizer))
                  for _ in range(args.steps)]
        while not coordinator.done():
            finished = [r for r in losses if r.done()]
            recent = [r.fetch() for r in finished[-50:]]
            progress(len(finished), args.steps, float(np.mean(recent)) if recent else 0.0, started)
            time.sleep(0.2)
        coordinator.join()
        progress(args.steps, args.steps, float(np.mean([r.fetch() for r in losses[-50:]])),
                 started)
        print()

        held_out = make_records(20_000, seed=2)
        score = auc(predict(model, held_out["ids"]), held_out["label"])
        print(f"held-out AUC: {score:.3f} (0.5 is chance)")

        with tempfile.TemporaryDirectory(prefix="convoy-ckpt-") as directory:
            manager = cv.train.CheckpointManager(cv.train.Checkpoint(model=model), directory,
                                                 max_to_keep=2)
            path = manager.save()
            resharded = cv.distribute.ParameterServerStrategy(
                cluster.resolver(),
                variable_partitioner=cv.distribute.partitioners.FixedShardsPartitioner(3))
            restored = build_model(resharded)
            cv.train.Checkpoint(model=restored).read(path)
            same = np.allclose(predict(restored, held_out["ids"]),
                               predict(model, held_out["ids"]))
            print(f"checkpoint {path.rsplit('/', 1)[-1]} restored into "
                  f"{len(restored['embedding'].variables)} shards: "
                  f"{'same predictions' if same else 'MISMATCH'}")
        coordinator.shutdown()
    return 0 if score > 0.6 and same else 1


if __name__ == "__main__":
    raise SystemExit(main())
