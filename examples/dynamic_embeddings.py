"""A DLRM-style recommender whose embedding tables grow with the data.

Users and items are hashed ids (any int64), drawn Zipf-distributed as real traffic is: a few
are everywhere, most are seen once or never again. Each categorical feature has a
``cv.torch.DynamicEmbeddingBag``, whose rows are made on the parameter servers the first time
an id is looked up: no vocabulary to size, no hash buckets to collide. Dense features go
through a small MLP; DLRM's pairwise dot products of the feature vectors feed the top MLP.

The model trains on 2 parameter servers and 2 workers (real processes, started here) and is
scored on held-out data by AUC; the item table is bounded (``max_rows``, LRU eviction).

    python examples/dynamic_embeddings.py
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import convoy as cv
from convoy.testing import TrainingCluster

DIM, STEPS, BATCH = 8, 300, 256
USERS, ITEMS = 1_000_000, 200_000


def hashed(ranks: np.ndarray, salt: int) -> np.ndarray:
    """Ranks as hashed 63-bit ids (as a feature-hashing pipeline makes them)."""
    mixed = (ranks.astype(np.uint64) + np.uint64(salt)) * np.uint64(0x9E3779B97F4A7C15)
    return (mixed >> np.uint64(1)).astype(np.int64)


def zipf(rng: np.random.Generator, size: int, count: int) -> np.ndarray:
    """Ranks in [0, count) drawn Zipf with exponent 1.1."""
    ranks = rng.zipf(1.1, size * 2)
    ranks = ranks[ranks <= count][:size]
    while ranks.size < size:
        ranks = np.concatenate([ranks, zipf(rng, size - ranks.size, count) + 1])
    return ranks - 1


def batch(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(user ids, item ids, dense features, clicks): a click is likelier when the user's and
    the item's hidden tastes agree (popular ids have their own, the others share some)."""
    rng = np.random.default_rng(seed)
    users, items = zipf(rng, BATCH, USERS), zipf(rng, BATCH, ITEMS)
    taste = np.random.default_rng(0).standard_normal((4, 2))
    user_taste = np.where(users[:, None] < 1000, np.sin(users[:, None] * taste[0] + taste[1]),
                          taste[2])
    item_taste = np.where(items[:, None] < 1000, np.cos(items[:, None] * taste[0] - taste[1]),
                          taste[3])
    dense = rng.standard_normal((BATCH, 4)).astype(np.float32)
    score = 3 * (user_taste * item_taste).sum(1) + dense[:, 0]
    clicks = (rng.random(BATCH) < 1 / (1 + np.exp(-score))).astype(np.float32)
    return hashed(users, 1)[:, None], hashed(items, 2)[:, None], dense, clicks


class DLRM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.users = cv.torch.DynamicEmbeddingBag(DIM, mode="sum")
        self.items = cv.torch.DynamicEmbeddingBag(DIM, mode="sum", max_rows=50_000,
                                                  eviction="lru")
        self.bottom = nn.Sequential(nn.Linear(4, DIM), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(3 * DIM + 3, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, users: torch.Tensor, items: torch.Tensor,
                dense: torch.Tensor) -> torch.Tensor:
        vectors = [self.users(users), self.items(items), self.bottom(dense)]
        dots = [(a * b).sum(1, keepdim=True) for i, a in enumerate(vectors)
                for b in vectors[i + 1:]]
        return self.top(torch.cat([*vectors, *dots], dim=1)).squeeze(-1)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The probability that a random click scores above a random non-click."""
    ranks = np.empty(scores.size)
    ranks[np.argsort(scores)] = np.arange(1, scores.size + 1)
    positives = labels == 1
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def train() -> float:
    """Train on 2 ps and 2 workers; the held-out AUC."""
    with TrainingCluster(num_workers=2, num_ps=2) as cluster:
        strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
        with strategy.scope():
            torch.manual_seed(0)
            model = cv.torch.place(DLRM())
            optimizer = cv.optimizers.Adagrad(0.1)
        coordinator = cv.distribute.ClusterCoordinator(strategy)

        def step(users, items, dense, clicks) -> float:
            logits = model(torch.from_numpy(users), torch.from_numpy(items),
                           torch.from_numpy(dense))
            loss = nn.functional.binary_cross_entropy_with_logits(logits,
                                                                  torch.from_numpy(clicks))
            loss.backward()
            optimizer.apply_gradients(model.gradients())
            return loss.item()

        try:
            losses = [coordinator.schedule(step, args=batch(i)) for i in range(STEPS)]
            coordinator.join()
            losses = [loss.fetch() for loss in losses]
            print(f"loss {np.mean(losses[:20]):.3f} -> {np.mean(losses[-20:]):.3f}; rows: "
                  f"users {model.users.size():,}, items {model.items.size():,} (at most 50,000)")
            held_out = [batch(10_000 + i) for i in range(8)]
            with torch.no_grad():
                scores = np.concatenate([model(*(torch.from_numpy(a) for a in b[:3])).numpy()
                                         for b in held_out])
            return auc(scores, np.concatenate([b[3] for b in held_out]))
        finally:
            coordinator.shutdown()


if __name__ == "__main__":
    print(f"held-out AUC {train():.3f}")
