"""``make demo``: a real preprocessing pipeline run by the data service, checked end to end.

It writes shards of CSV records (id, label, 16 features), starts a dispatcher and two worker
processes, and reads the records back through the service with DYNAMIC sharding:
list_files -> interleave(TextLineDataset) -> parse -> augment -> batch run on the workers,
each file handed to one of them. It shows progress, checks that every record arrived exactly
once, and prints the throughput next to the same pipeline run locally.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import convoy as cv

try:
    from tqdm import tqdm
except ImportError:  # progress bars are optional
    tqdm = None

NUM_FEATURES = 16


def write_shards(directory: Path, num_files: int, records_per_file: int) -> int:
    """Write ``num_files`` CSV shards; returns the number of records written."""
    rng = np.random.default_rng(0)
    record_id = 0
    for shard in range(num_files):
        lines = []
        for _ in range(records_per_file):
            features = rng.standard_normal(NUM_FEATURES)
            label = int(features[:4].sum() > 0)
            lines.append(",".join([str(record_id), str(label), *(f"{v:.5f}" for v in features)]))
            record_id += 1
        (directory / f"shard-{shard:03d}.csv").write_text("\n".join(lines) + "\n")
    return record_id


def parse(line: bytes) -> dict[str, np.ndarray]:
    fields = line.split(b",")
    return {
        "id": np.int64(fields[0]),
        "label": np.int64(fields[1]),
        "features": np.array(fields[2:], dtype=np.float32),
    }


def augment(record: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    noise = np.random.default_rng(int(record["id"])).normal(0, 0.01, NUM_FEATURES)
    return {**record, "features": (record["features"] + noise).astype(np.float32)}


def build_pipeline(directory: Path, batch_size: int) -> cv.data.Dataset:
    files = cv.data.Dataset.list_files(str(directory / "shard-*.csv"), shuffle=False)
    return (files.interleave(cv.data.TextLineDataset, cycle_length=4, num_parallel_calls=4)
            .map(parse)
            .map(augment, num_parallel_calls=cv.data.AUTOTUNE)
            .batch(batch_size))


def consume(dataset: cv.data.Dataset, total: int) -> np.ndarray:
    """Read every batch, with a progress bar when tqdm is installed; returns the ids seen."""
    ids = []
    bar = tqdm(total=total, unit="rec", desc="reading") if tqdm else None
    for batch in dataset:
        ids.append(batch["id"])
        if bar:
            bar.update(len(batch["id"]))
    if bar:
        bar.close()
    return np.concatenate(ids)


def run(name: str, dataset: cv.data.Dataset, total: int) -> bool:
    """Read ``dataset`` to the end, check every record came exactly once, print the rate."""
    started = time.perf_counter()
    ids = consume(dataset, total)
    elapsed = time.perf_counter() - started
    distinct = len(np.unique(ids))
    exactly_once = len(ids) == total and distinct == total
    verdict = "every record exactly once" if exactly_once else "MISMATCH"
    print(f"{name}: {len(ids):,} records, {distinct:,} distinct: {verdict}; "
          f"{len(ids) / elapsed:,.0f} records/s ({elapsed:.2f} s)")
    return exactly_once


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--records-per-file", type=int, default=5_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from convoy.testing import ProcessCluster

    with tempfile.TemporaryDirectory(prefix="convoy-demo-") as tmp:
        directory = Path(tmp)
        total = write_shards(directory, args.files, args.records_per_file)
        print(f"wrote {total:,} records in {args.files} files under {directory}")
        pipeline = build_pipeline(directory, args.batch_size)
        ok = run("local pipeline", pipeline, total)
        with ProcessCluster(args.workers) as cluster:
            print(f"dispatcher at {cluster.dispatcher.address} (pid "
                  f"{cluster.dispatcher.process.pid}), workers at "
                  f"{', '.join(w.address for w in cluster.workers)}")
            distributed = pipeline.apply(cv.data.service.distribute(
                cv.data.service.ShardingPolicy.DYNAMIC, cluster.target))
            ok = run(f"data service, {args.workers} workers, DYNAMIC", distributed,
                     total) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
